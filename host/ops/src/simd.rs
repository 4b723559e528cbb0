//! The numeric helpers the CPU kernels share: loads and stores of `pulp`
//! vectors, two polynomial `exp`s, and sums and products written so that
//! the compiler vectorises them.
//!
//! How the kernels use them: each kernel is a `pulp::WithSimd` whose
//! `with_simd` is plain loops over slices and fixed-size arrays, every
//! helper `inline(always)`. `pulp::Arch::dispatch` compiles `with_simd`
//! inside a function with the CPU's best instruction set enabled (AVX2 and
//! FMA, or AVX-512) and picks it at run time, where the binary itself
//! targets baseline x86-64; the helpers, inlined, are compiled into it. (A
//! closure handed to `dispatch` is compiled on its own, for baseline
//! x86-64.) Each output element is summed in an order fixed by the code,
//! whatever the vector width, so every instruction set gives the same result
//! (`mul_add` is one rounding everywhere).
//!
//! Two `exp`s: [`exp`] works on `pulp` vectors, for the kernels that handle
//! vectors explicitly (attention's softmax, the token scores); [`exp_neg`]
//! is scalar, branch-free and cast-free, so that a loop calling it
//! vectorises (GELU's `erf`, SwiGLU's sigmoid).

/// The widest vector any instruction set has: 16 floats, one AVX-512
/// register or two AVX2 ones. Rows the kernels read a vector at a time are
/// padded to a multiple of it.
pub(crate) const LANES: usize = 16;

/// 1.5·2²³: adding it to a float of magnitude below 2²² rounds it to an
/// integer, which the sum's low mantissa bits then hold (both `exp`s take
/// `2ⁿ` from there, without a float-to-integer conversion).
const ROUND: f32 = 12_582_912.0;

/// The vector at `x[at..]` (its length in floats is `S`'s width, which
/// divides [`LANES`]).
#[inline(always)]
pub(crate) fn load<S: pulp::Simd>(x: &[f32], at: usize) -> S::f32s {
    S::as_simd_f32s(&x[at..at + size_of::<S::f32s>() / 4]).0[0]
}

/// Writes `v` at `x[at..]`.
#[inline(always)]
pub(crate) fn store<S: pulp::Simd>(x: &mut [f32], at: usize, v: S::f32s) {
    S::as_mut_simd_f32s(&mut x[at..at + size_of::<S::f32s>() / 4]).0[0] = v;
}

/// The largest lane of the vectors `x` (−∞ for none): a row's maximum,
/// its padding −∞.
#[inline(always)]
pub(crate) fn max_lane<S: pulp::Simd>(simd: S, x: &[S::f32s]) -> f32 {
    simd.reduce_max_f32s(x.iter().fold(simd.splat_f32s(f32::NEG_INFINITY), |m, &v| simd.max_f32s(m, v)))
}

/// `eˣ` for `x ≤ 0` (softmax's shifted scores), a vector at a time, in
/// straight-line arithmetic: `eˣ = 2ⁿ·eʳ` with `n = round(x·log₂e)` and `eʳ`
/// by Cephes' degree-6 polynomial on `|r| ≤ ln2/2`; relative error below
/// 2e-7. Below −87 (and for −∞, a hidden key) it is 0.
#[inline(always)]
pub(crate) fn exp<S: pulp::Simd>(simd: S, x: S::f32s) -> S::f32s {
    let splat = |c: f32| simd.splat_f32s(c);
    let xc = simd.max_f32s(x, splat(-87.0));
    let shifted = simd.mul_add_f32s(xc, splat(std::f32::consts::LOG2_E), splat(ROUND)); // its low bits hold n
    let n = simd.sub_f32s(shifted, splat(ROUND));
    let r = simd.mul_add_f32s(n, splat(2.121_944_4e-4), simd.mul_add_f32s(n, splat(-0.693_359_4), xc)); // x − n·ln2, in two parts
    let mut poly = splat(1.987_569_1e-4);
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_66, 0.5, 1.0, 1.0] {
        poly = simd.mul_add_f32s(poly, r, splat(c));
    }
    // 2ⁿ from n's bits, without a float-to-integer conversion.
    let n_bits = simd.sub_u32s(simd.transmute_u32s_f32s(shifted), simd.splat_u32s(ROUND.to_bits() - 127));
    let two_n = simd.transmute_f32s_u32s(simd.wrapping_dyn_shl_u32s(n_bits, simd.splat_u32s(23)));
    simd.select_f32s(simd.less_than_f32s(x, splat(-87.0)), splat(0.0), simd.mul_f32s(poly, two_n))
}

/// `eᵞ` for `y ≤ 0` (0 below −87), to a few units in the last place:
/// `y = n ln 2 + r` with `|r| ≤ ln 2 / 2`, `eʳ` by its Taylor series to
/// degree 6 (relative error 1.2e-7), `2ⁿ` written into the exponent bits.
/// No float-to-integer cast (Rust's saturates, with a branch that stops
/// vectorisation): `y log₂e + 1.5·2²³` holds `n` in its low mantissa bits.
#[inline(always)]
pub(crate) fn exp_neg(y: f32) -> f32 {
    let y = y.max(-87.0);
    let shifted = y * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (y - n * 0.693_145_75) - n * 1.428_606_8e-6; // ln 2 in two parts
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits()); // n, two's complement
    p * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// Σ aᵢ·bᵢ, in eight independent partial sums (which vectorise; one
/// running sum would not, float addition not being associative). The
/// order is fixed by the code, so every instruction set gets the same result.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in a8.zip(b8) {
        for ((l, x), y) in lanes.iter_mut().zip(x).zip(y) {
            *l += x * y;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `Σ f(i)` for `i < n`, in eight interleaved partial sums: a float sum in
/// one accumulator is a chain the compiler may not reorder, eight of them
/// are one vector register.
#[inline(always)]
pub(crate) fn lane_sum(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let whole = n - n % 8;
    for i in (0..whole).step_by(8) {
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane += f(i + l);
        }
    }
    lanes.iter().sum::<f32>() + (whole..n).map(f).sum::<f32>()
}

/// `y += a·x`.
#[inline(always)]
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_polynomial_exp_is_within_a_few_ulps_of_libms() {
        struct Exp<'a>(&'a mut [f32]);
        impl pulp::WithSimd for Exp<'_> {
            type Output = ();
            fn with_simd<S: pulp::Simd>(self, simd: S) {
                for x in S::as_mut_simd_f32s(self.0).0 {
                    *x = exp(simd, *x);
                }
            }
        }
        let inputs: Vec<f32> = (0..100_000).map(|i| -87.0 * i as f32 / 99_999.0).chain([-87.5, -100.0, f32::NEG_INFINITY]).collect();
        // The instruction set this machine runs, and one float at a time.
        let mut vectors = inputs.clone();
        vectors.resize(inputs.len().next_multiple_of(LANES), 0.0);
        pulp::Arch::new().dispatch(Exp(&mut vectors));
        let scalars: Vec<f32> = inputs.iter().map(|&x| exp(pulp::Scalar, x)).collect();
        for ((&x, &vector), &scalar) in inputs.iter().zip(&vectors).zip(&scalars) {
            let libm = x.exp();
            let within = |ours: f32| if x < -87.0 { ours == 0.0 } else { (ours - libm).abs() <= 3e-7 * libm };
            assert!(within(vector) && within(scalar), "exp({x}): {vector} in vectors, {scalar} alone, libm {libm}");
        }
    }
}
