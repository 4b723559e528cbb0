//! Flex's kernel for the token scores of a chunk of logits, forward and
//! backward, one row at a time.
//!
//! Composed from tensor operations (divide, mask, log-softmax, gather,
//! `exp · log`, and in the backward pass exp, multiply, scatter, divide),
//! a chunk of `[c, v]` logits went through a dozen operations, each
//! allocating, zeroing and filling a `[c, v]` tensor, with a scalar `exp`:
//! for the default model, a large share of a training pass
//! (docs/results.md, "A pool per pass, memory kept, and token scores in one
//! kernel"). Here each row is read once into a scratch row and gone over
//! three times in vector registers; the forward pass writes two numbers per
//! row, the backward pass the logits' gradient, its only `[c, v]`
//! allocation.
//!
//! Per row, with `s = z / T` (forbidden tokens at −1e9), `m = max s`,
//! `d = s − m`, `e = exp d`, `S = Σ e`:
//!
//! ```text
//! lp = d − ln S          score = lp[y]        H = ln S − Σ e·d / S
//! dz = (g_score · (onehot(y) − p) − g_H · p ∘ (lp + H)) / T,   p = e / S
//! ```
//!
//! `d` is clamped at −10⁴ where it multiplies: `exp` is 0 below −87
//! already, and the clamp keeps `0 · d` from being `0 · −∞` (NaN) for the
//! scratch row's padding. The taken token's score uses its unclamped `d`.

use crate::flex::rows_per_task;
use crate::simd::{LANES, exp, max_lane};
use rayon::prelude::*;

/// Where `d` is clamped before it multiplies (see the module doc).
const D_FLOOR: f32 = -1.0e4;

/// One chunk's inputs: `logits` `[c, v]` row-major, `taken` `[c]`,
/// `allowed` `[c, v]` where given, the temperature.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub logits: &'a [f32],
    pub v: usize,
    pub taken: &'a [i64],
    pub allowed: Option<&'a [bool]>,
    pub temperature: f32,
}

impl<'a> Rows<'a> {
    /// Rows `at..at + n`.
    fn part(self, at: usize, n: usize) -> Rows<'a> {
        let v = self.v;
        Rows {
            logits: &self.logits[at * v..(at + n) * v],
            taken: &self.taken[at..at + n],
            allowed: self.allowed.map(|a| &a[at * v..(at + n) * v]),
            ..self
        }
    }

    fn len(&self) -> usize {
        self.taken.len()
    }
}

/// `[c, 2]`: the taken token's log-probability and the entropy, per row.
pub(crate) fn forward(rows: Rows) -> Vec<f32> {
    let mut out = vec![0.0f32; 2 * rows.len()];
    let simd = pulp::Arch::new();
    let per = rows_per_task(rows.v);
    out.par_chunks_mut(2 * per).enumerate().for_each(|(i, out)| {
        simd.dispatch(Kernel { rows: rows.part(i * per, out.len() / 2), grad: None, out });
    });
    out
}

/// `[c, v]`: the logits' gradient given `grad` `[c, 2]` of [`forward`]'s
/// output.
pub(crate) fn backward(rows: Rows, grad: &[f32]) -> Vec<f32> {
    let v = rows.v;
    let mut out = vec![0.0f32; v * rows.len()];
    let simd = pulp::Arch::new();
    let per = rows_per_task(v);
    out.par_chunks_mut(per * v).zip(grad.par_chunks(2 * per)).enumerate().for_each(|(i, (out, grad))| {
        simd.dispatch(Kernel { rows: rows.part(i * per, grad.len() / 2), grad: Some(grad), out });
    });
    out
}

/// Some rows, forward (`grad` `None`, `out` `[rows, 2]`) or backward
/// (`out` `[rows, v]`).
struct Kernel<'a> {
    rows: Rows<'a>,
    grad: Option<&'a [f32]>,
    out: &'a mut [f32],
}

/// One row's sums: `m`, `ln S`, and `Σ e·d / S`.
struct RowSums {
    max: f32,
    ln_sum: f32,
    mean_d: f32,
}

impl pulp::WithSimd for Kernel<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        let Kernel { rows, grad, out } = self;
        let v = rows.v;
        let mut scratch = vec![f32::NEG_INFINITY; v.next_multiple_of(LANES)];
        let mut e = vec![0.0f32; scratch.len()];
        for r in 0..rows.len() {
            let s = &mut scratch[..v];
            let z = &rows.logits[r * v..(r + 1) * v];
            match rows.allowed {
                Some(allowed) => {
                    for ((s, &z), &ok) in s.iter_mut().zip(z).zip(&allowed[r * v..(r + 1) * v]) {
                        *s = if ok { z / rows.temperature } else { -1.0e9 };
                    }
                }
                None => s.iter_mut().zip(z).for_each(|(s, &z)| *s = z / rows.temperature),
            }
            let y = usize::try_from(rows.taken[r]).ok().filter(|&y| y < v).expect("a taken token inside the vocabulary");
            let sums = row_sums(simd, &scratch, &mut e);
            let lp_y = scratch[y] - sums.max - sums.ln_sum;
            let entropy = sums.ln_sum - sums.mean_d;
            match grad {
                None => {
                    out[2 * r] = lp_y;
                    out[2 * r + 1] = entropy;
                }
                Some(grad) => {
                    let (g_score, g_entropy) = (grad[2 * r], grad[2 * r + 1]);
                    let dz = &mut out[r * v..(r + 1) * v];
                    row_gradient(simd, &scratch, &mut e, &sums, [g_score, g_entropy, entropy, rows.temperature], dz);
                    dz[y] += g_score / rows.temperature;
                }
            }
        }
    }
}

/// `m`, `ln S` and `Σ e·d / S` of the scratch row `s` (padded with −∞),
/// leaving `e = exp(s − m)` in `e`.
#[inline(always)]
fn row_sums<S: pulp::Simd>(simd: S, s: &[f32], e: &mut [f32]) -> RowSums {
    let (s, _) = S::as_simd_f32s(s);
    let (e, _) = S::as_mut_simd_f32s(e);
    let max = max_lane(simd, s);
    let (m, floor) = (simd.splat_f32s(max), simd.splat_f32s(D_FLOOR));
    let (mut total, mut weighted) = (simd.splat_f32s(0.0), simd.splat_f32s(0.0));
    for (&s, e) in s.iter().zip(e.iter_mut()) {
        let d = simd.sub_f32s(s, m);
        *e = exp(simd, d);
        total = simd.add_f32s(total, *e);
        weighted = simd.mul_add_f32s(*e, simd.max_f32s(d, floor), weighted);
    }
    let total = simd.reduce_sum_f32s(total);
    RowSums { max, ln_sum: total.ln(), mean_d: simd.reduce_sum_f32s(weighted) / total }
}

/// `dz` without the taken token's `g_score / T` (the caller adds it),
/// computed over `e` in place and copied to `dz`.
#[inline(always)]
fn row_gradient<S: pulp::Simd>(
    simd: S,
    s: &[f32],
    e: &mut [f32],
    sums: &RowSums,
    [g_score, g_entropy, entropy, t]: [f32; 4],
    dz: &mut [f32],
) {
    let splat = |c: f32| simd.splat_f32s(c);
    // lp + H = d − ln S + H, and dz = −(e / (S·T)) · (g_score + g_H · (lp + H)).
    let (m, floor, shift) = (splat(sums.max), splat(D_FLOOR), splat(entropy - sums.ln_sum));
    let (g_s, g_h, scale) = (splat(g_score), splat(g_entropy), splat(-(-sums.ln_sum).exp() / t));
    let (s, _) = S::as_simd_f32s(s);
    let (e_v, _) = S::as_mut_simd_f32s(e);
    for (&s, e) in s.iter().zip(e_v.iter_mut()) {
        let lp_h = simd.add_f32s(simd.max_f32s(simd.sub_f32s(s, m), floor), shift);
        *e = simd.mul_f32s(simd.mul_f32s(*e, scale), simd.mul_add_f32s(g_h, lp_h, g_s));
    }
    dz.copy_from_slice(&e[..dz.len()]);
}
