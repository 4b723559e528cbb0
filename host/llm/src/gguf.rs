//! GGUF files: the header, the metadata, the tensor directory, and each
//! tensor's bytes dequantised to `f32`.
//!
//! Hand-written on purpose. The format is a short, stable header (a magic,
//! typed key-value pairs, then a tensor directory) followed by aligned raw
//! blocks; the one maintained Rust reader (candle-core's `gguf_file`) comes
//! with a second tensor library and its matrix kernels, which would add
//! minutes to every cold build on CI's two cores for a few hundred lines of
//! parsing. The block layouts below follow ggml's `ggml-quants.c`; the tests
//! check them against the `gguf` Python package's dequantiser on a fixture
//! (`scripts/reference/gguf_blocks.json`).
//!
//! Reading is all the library does. The tests write tiny models in the same
//! format with the writer of `ragen-test-fixtures` (its `gguf_writer`),
//! which takes the format's constants from here ([`MAGIC`],
//! [`DEFAULT_ALIGNMENT`], [`TensorType::id`]) so that writer and reader
//! agree.

use anyhow::{Context, Result, bail, ensure};
use half::{bf16, f16};
use ragen_ops::{BlockQ4, BlockQ8, QuantBlocks, QuantMatrix};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The four bytes a GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// The alignment, in bytes, of the data section and of each tensor's bytes
/// in it, unless the metadata's `general.alignment` sets another.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U64(v) => Some(v),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F64(v) => Some(v),
            Value::U64(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A tensor's element type, as ggml numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q8_0,
    Q4K,
    Q6K,
}

impl TensorType {
    fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            14 => Self::Q6K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// ggml's number for the type, as a tensor's entry in the file's
    /// directory stores it.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q8_0 => 8,
            Self::Q4K => 12,
            Self::Q6K => 14,
            Self::BF16 => 30,
        }
    }

    /// (values per block, bytes per block).
    fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q8_0 => (32, 34),
            Self::Q4K => (256, 144),
            Self::Q6K => (256, 210),
        }
    }

    /// Bytes that `n` values take.
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        let (per, bytes) = self.block();
        n.is_multiple_of(per).then_some(n / per * bytes)
    }
}

/// ggml's names for the types we do not read, for error messages.
fn unsupported_type_name(id: u32) -> String {
    let names = [
        (6, "Q5_0"),
        (7, "Q5_1"),
        (9, "Q8_1"),
        (10, "Q2_K"),
        (11, "Q3_K"),
        (13, "Q5_K"),
        (15, "Q8_K"),
        (16, "IQ2_XXS"),
        (17, "IQ2_XS"),
        (18, "IQ3_XXS"),
        (19, "IQ1_S"),
        (20, "IQ4_NL"),
        (21, "IQ3_S"),
        (22, "IQ2_S"),
        (23, "IQ4_XS"),
        (24, "I8"),
        (25, "I16"),
        (26, "I32"),
        (27, "I64"),
        (28, "F64"),
        (29, "IQ1_M"),
    ];
    names.iter().find(|(i, _)| *i == id).map_or_else(|| format!("type {id}"), |(_, n)| n.to_string())
}

/// Where one tensor lies in the file.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// ggml's dimensions, fastest-varying first: a `[rows, cols]` matrix is
    /// `[cols, rows]` here.
    pub dims: Vec<u64>,
    pub kind: Result<TensorType, u32>,
    /// From the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn len(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The dimensions in row-major order (`[rows, cols]`), as PyTorch and
    /// Burn write them.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A GGUF file read into memory.
pub struct Gguf {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: BTreeMap<String, TensorInfo>,
    bytes: Vec<u8>,
    data_start: usize,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf").field("path", &self.path).field("version", &self.version).field("tensors", &self.tensors.len()).finish()
    }
}

/// A cursor over the header that names what it was reading when the file
/// ran out.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            bail!(
                "the file ends at byte {} while reading {what} (it needs {n} more bytes): it is truncated; download it again",
                self.bytes.len()
            )
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        ensure!(len <= 1 << 30, "{what}: a string of {len} bytes is not plausible; the file is damaged");
        let bytes = self.take(len as usize, what)?;
        String::from_utf8(bytes.to_vec()).with_context(|| format!("{what} is not UTF-8; the file is damaged"))
    }

    fn value(&mut self, kind: u32, what: &str) -> Result<Value> {
        Ok(match kind {
            0 => Value::U64(self.take(1, what)?[0] as u64),
            1 => Value::I64(self.take(1, what)?[0] as i8 as i64),
            2 => Value::U64(u16::from_le_bytes(self.take(2, what)?.try_into().expect("2")) as u64),
            3 => Value::I64(i16::from_le_bytes(self.take(2, what)?.try_into().expect("2")) as i64),
            4 => Value::U64(self.u32(what)? as u64),
            5 => Value::I64(self.u32(what)? as i32 as i64),
            6 => Value::F64(f32::from_bits(self.u32(what)?) as f64),
            7 => Value::Bool(self.take(1, what)?[0] != 0),
            8 => Value::Str(self.string(what)?),
            9 => {
                let inner = self.u32(what)?;
                let len = self.u64(what)?;
                ensure!(
                    len <= (self.bytes.len() - self.at) as u64,
                    "{what}: an array of {len} items cannot fit in the file; it is damaged"
                );
                Value::Array((0..len).map(|_| self.value(inner, what)).collect::<Result<_>>()?)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(self.u64(what)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(what)?)),
            other => bail!("{what} has value type {other}, which GGUF does not define; the file is damaged"),
        })
    }
}

impl Gguf {
    /// Read the whole file and parse its header.
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("cannot read the model file {}", path.display()))?;
        Self::parse(path, bytes).with_context(|| format!("{} is not a usable GGUF file", path.display()))
    }

    fn parse(path: &Path, bytes: Vec<u8>) -> Result<Self> {
        let mut r = Reader { bytes: &bytes, at: 0 };
        let magic = r.take(4, "the magic number")?;
        ensure!(
            magic == MAGIC,
            "it starts with {magic:?}, not GGUF's magic \"GGUF\": pass a .gguf file, or a Hugging Face model directory (config.json and *.safetensors)"
        );
        let version = r.u32("the version")?;
        ensure!((2..=3).contains(&version), "GGUF version {version} is not supported (2 and 3 are)");
        let n_tensors = r.u64("the tensor count")?;
        let n_kv = r.u64("the metadata count")?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key {i}"))?;
            let kind = r.u32(&format!("the type of metadata {key:?}"))?;
            let value = r.value(kind, &format!("metadata {key:?}"))?;
            metadata.insert(key, value);
        }
        let mut tensors = BTreeMap::new();
        for i in 0..n_tensors {
            let name = r.string(&format!("the name of tensor {i}"))?;
            let n_dims = r.u32(&format!("tensor {name:?}'s rank"))?;
            ensure!(n_dims <= 4, "tensor {name:?} has {n_dims} dimensions (at most 4); the file is damaged");
            let dims = (0..n_dims).map(|_| r.u64(&format!("tensor {name:?}'s dimensions"))).collect::<Result<Vec<_>>>()?;
            // No type packs more than two values in a byte: more values
            // than that cannot be in the file, whatever its type says.
            let values = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
            ensure!(
                values.is_some_and(|n| n <= 2 * bytes.len() as u64),
                "tensor {name:?} has dimensions {dims:?}, more values than the file could hold; the file is damaged"
            );
            let id = r.u32(&format!("tensor {name:?}'s type"))?;
            let offset = r.u64(&format!("tensor {name:?}'s offset"))?;
            tensors.insert(name, TensorInfo { dims, kind: TensorType::from_id(id).ok_or(id), offset });
        }
        let alignment = metadata.get("general.alignment").and_then(Value::as_u64).unwrap_or(DEFAULT_ALIGNMENT).max(1);
        let data_start = r.at.div_ceil(alignment as usize) * alignment as usize;
        Ok(Self { path: path.to_path_buf(), version, metadata, tensors, bytes, data_start })
    }

    /// Where the tensor data begins: the bytes before it are the header
    /// (metadata and the tensor table).
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// A tensor's values as `f32`, row-major in [`TensorInfo::shape`].
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let (kind, bytes, n) = self.tensor_bytes(name)?;
        Ok(dequantize(kind, bytes, n))
    }

    /// A 2-D tensor `[rows, cols]` kept quantized, for the kernels that
    /// multiply by it as it is ([`quantized`]); `None` when it is stored as
    /// floats (or its rows are not whole blocks of 32).
    pub fn tensor_quantized(&self, name: &str) -> Result<Option<QuantMatrix>> {
        let (kind, bytes, n) = self.tensor_bytes(name)?;
        let shape = self.tensors[name].shape();
        let [rows, cols] = shape[..] else { return Ok(None) };
        if !cols.is_multiple_of(ragen_ops::BLOCK) {
            return Ok(None);
        }
        Ok(quantized(kind, bytes, n).map(|blocks| match blocks {
            Blocks::Exact(blocks) => QuantMatrix::new(rows, cols, blocks),
            Blocks::Dequantized(values) => QuantMatrix::quantize_q8(&values, rows, cols),
        }))
    }

    /// A tensor's type, bytes and number of values, checked against the
    /// file.
    fn tensor_bytes(&self, name: &str) -> Result<(TensorType, &[u8], usize)> {
        let info = self.tensors.get(name).with_context(|| {
            format!(
                "tensor {name:?} is missing from {}: the file is not a complete model of its architecture (was it converted by a recent llama.cpp?)",
                self.path.display()
            )
        })?;
        let kind = info.kind.map_err(|id| {
            anyhow::anyhow!(
                "tensor {name:?} in {} is stored as {}, which we cannot dequantise (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K are read): \
                 convert the model with one of those, e.g. llama.cpp's `llama-quantize model.gguf out.gguf Q8_0`",
                self.path.display(),
                unsupported_type_name(id)
            )
        })?;
        let n = info.len();
        let size = kind
            .bytes_for(n)
            .with_context(|| format!("tensor {name:?} has {n} values, not a whole number of {kind:?} blocks; the file is damaged"))?;
        let start = (self.data_start as u64).saturating_add(info.offset);
        let end = start.saturating_add(size as u64);
        ensure!(
            end <= self.bytes.len() as u64,
            "tensor {name:?} lies at bytes {start}..{end} but {} has only {} bytes: it is truncated; download it again",
            self.path.display(),
            self.bytes.len()
        );
        Ok((kind, &self.bytes[start as usize..end as usize], n))
    }
}

/// What [`quantized`] makes of a type's blocks.
pub enum Blocks {
    /// The kernel's blocks, holding exactly the values [`dequantize`] gives.
    Exact(QuantBlocks),
    /// A type the kernel has no block for (Q6_K, whose scales change every
    /// 16 values): its values, for rounding to 8 bits.
    Dequantized(Vec<f32>),
}

/// Bytes of `n` values of a quantized type as the kernel's blocks; `None`
/// for the float types.
pub fn quantized(kind: TensorType, bytes: &[u8], n: usize) -> Option<Blocks> {
    let (_, size) = kind.block();
    let blocks = bytes.chunks_exact(size);
    Some(match kind {
        TensorType::F32 | TensorType::F16 | TensorType::BF16 => return None,
        TensorType::Q8_0 => {
            Blocks::Exact(QuantBlocks::Q8(blocks.map(|b| BlockQ8 { d: half16(b), qs: std::array::from_fn(|i| b[2 + i] as i8) }).collect()))
        }
        // Q4_0's `d·(q − 8)` is `d·q + m` with `m = −8d`, exactly.
        TensorType::Q4_0 => Blocks::Exact(QuantBlocks::Q4(
            blocks.map(|b| BlockQ4 { d: half16(b), m: -8.0 * half16(b), qs: b[2..18].try_into().expect("16") }).collect(),
        )),
        TensorType::Q4_1 => Blocks::Exact(QuantBlocks::Q4(
            blocks.map(|b| BlockQ4 { d: half16(b), m: half16(&b[2..]), qs: b[4..20].try_into().expect("16") }).collect(),
        )),
        TensorType::Q4K => Blocks::Exact(QuantBlocks::Q4(blocks.flat_map(q4k_blocks).collect())),
        TensorType::Q6K => Blocks::Dequantized(dequantize(kind, bytes, n)),
    })
}

/// A Q4_K block's eight sub-blocks of 32 as 4-bit blocks: scale `d·sc`,
/// offset `−dmin·m`, and the nibbles repacked from Q4_K's order (values
/// `64c..64c + 32` in the low nibbles of 32 bytes, the next 32 in their
/// high nibbles) into Q4_1's.
fn q4k_blocks(block: &[u8]) -> [BlockQ4; 8] {
    let (d, dmin) = (half16(block), half16(&block[2..]));
    let qs = &block[16..144];
    std::array::from_fn(|j| {
        let (sc, m) = q4k_scale_min(&block[4..16], j);
        let q = &qs[32 * (j / 2)..][..32];
        let shift = 4 * (j % 2);
        let nib = |i: usize| (q[i] >> shift) & 0xF;
        BlockQ4 { d: d * sc, m: -(dmin * m), qs: std::array::from_fn(|i| nib(i) | (nib(16 + i) << 4)) }
    })
}

/// Sub-block `j`'s 6-bit scale and minimum, from Q4_K's 12 packed bytes.
fn q4k_scale_min(scales: &[u8], j: usize) -> (f32, f32) {
    if j < 4 {
        ((scales[j] & 63) as f32, (scales[j + 4] & 63) as f32)
    } else {
        let sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc as f32, m as f32)
    }
}

/// Bytes of `n` values of type `kind` to `f32`.
pub fn dequantize(kind: TensorType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    let (per, size) = kind.block();
    for block in bytes.chunks_exact(size) {
        match kind {
            TensorType::F32 => out.push(f32::from_le_bytes(block.try_into().expect("4"))),
            TensorType::F16 => out.push(half16(block)),
            TensorType::BF16 => out.push(bf16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32()),
            TensorType::Q8_0 => {
                let d = half16(block);
                out.extend(block[2..].iter().map(|&q| d * q as i8 as f32));
            }
            TensorType::Q4_0 => {
                let d = half16(block);
                let qs = &block[2..];
                out.extend(qs.iter().map(|&q| d * ((q & 0xF) as f32 - 8.0)));
                out.extend(qs.iter().map(|&q| d * ((q >> 4) as f32 - 8.0)));
            }
            TensorType::Q4_1 => {
                let (d, m) = (half16(block), half16(&block[2..]));
                let qs = &block[4..];
                out.extend(qs.iter().map(|&q| d * (q & 0xF) as f32 + m));
                out.extend(qs.iter().map(|&q| d * (q >> 4) as f32 + m));
            }
            TensorType::Q4K => dequantize_q4k(block, &mut out),
            TensorType::Q6K => dequantize_q6k(block, &mut out),
        }
    }
    debug_assert_eq!(out.len(), bytes.len() / size * per);
    out
}

fn half16(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// Q4_K: 256 values as 8 sub-blocks of 32, each with a 6-bit scale and
/// minimum packed into 12 bytes, times the block's `d` and `dmin`.
fn dequantize_q4k(block: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half16(block), half16(&block[2..]));
    let qs = &block[16..144];
    let scale_min = |j: usize| q4k_scale_min(&block[4..16], j);
    for (chunk, q) in qs.chunks_exact(32).enumerate() {
        let (s1, m1) = scale_min(2 * chunk);
        let (s2, m2) = scale_min(2 * chunk + 1);
        out.extend(q.iter().map(|&x| d * s1 * (x & 0xF) as f32 - dmin * m1));
        out.extend(q.iter().map(|&x| d * s2 * (x >> 4) as f32 - dmin * m2));
    }
}

/// Q6_K: 256 six-bit values (low 4 bits in `ql`, high 2 in `qh`) in 16
/// groups of 16 with an 8-bit scale each, times the block's `d`.
fn dequantize_q6k(block: &[u8], out: &mut Vec<f32>) {
    let (ql, qh) = (&block[..128], &block[128..192]);
    let sc: Vec<f32> = block[192..208].iter().map(|&s| s as i8 as f32).collect();
    let d = half16(&block[208..]);
    for half in 0..2 {
        let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..]);
        let mut y = [0f32; 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * sc[is] * q1 as f32;
            y[l + 32] = d * sc[is + 2] * q2 as f32;
            y[l + 64] = d * sc[is + 4] * q3 as f32;
            y[l + 96] = d * sc[is + 6] * q4 as f32;
        }
        out.extend_from_slice(&y);
    }
}
