//! The dequantisers against llama.cpp's own (the `gguf` Python package), on
//! random blocks of every type we read (`scripts/reference/gguf_blocks.py`),
//! and the reader on files the fixtures' writer makes.

use ragen_llm::gguf::{Blocks, Gguf, TensorType, Value, dequantize, quantized};
use ragen_ops::QuantMatrix;
use ragen_test_fixtures::gguf_writer::{GgufWriter, quantize};
use std::path::Path;

/// The fixture's cases: each type's bytes and llama.cpp's values for them.
fn block_cases() -> Vec<(TensorType, Vec<u8>, Vec<f32>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/reference/gguf_blocks.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; re-make it with scripts/reference/gguf_blocks.py", path.display()));
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 7, "one case per type");
    cases
        .iter()
        .map(|case| {
            let kind = match case["type"].as_str().unwrap() {
                "Q8_0" => TensorType::Q8_0,
                "Q4_0" => TensorType::Q4_0,
                "Q4_1" => TensorType::Q4_1,
                "Q4_K" => TensorType::Q4K,
                "Q6_K" => TensorType::Q6K,
                "F16" => TensorType::F16,
                "BF16" => TensorType::BF16,
                other => panic!("unexpected type {other}"),
            };
            let hex = case["hex"].as_str().unwrap();
            let bytes = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
            let expected = case["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            (kind, bytes, expected)
        })
        .collect()
}

#[test]
fn every_block_type_dequantises_as_llama_cpp_does() {
    for (kind, bytes, expected) in block_cases() {
        let got = dequantize(kind, &bytes, expected.len());
        assert_eq!(got.len(), expected.len(), "{kind:?}");
        for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{kind:?} value {i}: {a} but llama.cpp gives {b}");
        }
    }
}

/// The blocks the quantized kernels read hold llama.cpp's values exactly,
/// for every type but Q6_K, which is rounded to 8 bits: within half of
/// its sub-block's new step.
#[test]
fn kept_quantized_every_block_type_holds_llama_cpp_values() {
    let mut seen = 0;
    for (kind, bytes, expected) in block_cases() {
        let n = expected.len();
        let Some(blocks) = quantized(kind, &bytes, n) else {
            assert!(matches!(kind, TensorType::F16 | TensorType::BF16), "{kind:?} is quantized but was not kept so");
            continue;
        };
        seen += 1;
        let (exact, matrix) = match blocks {
            Blocks::Exact(blocks) => (true, QuantMatrix::new(1, n, blocks)),
            Blocks::Dequantized(values) => (false, QuantMatrix::quantize_q8(&values, 1, n)),
        };
        assert_eq!(exact, kind != TensorType::Q6K, "{kind:?}: only Q6_K has no exact block");
        for (block, (got, want)) in matrix.dequantize().chunks(32).zip(expected.chunks(32)).enumerate() {
            // Q6_K re-rounded: 8-bit steps of the block's largest magnitude.
            let step = if exact { 0.0 } else { want.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0 };
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                let tolerance = 1e-6 * b.abs().max(1.0) + step * 0.51;
                assert!((a - b).abs() <= tolerance, "{kind:?} block {block} value {i}: {a} but llama.cpp gives {b}");
            }
        }
    }
    assert_eq!(seen, 5, "Q8_0, Q4_0, Q4_1, Q4_K and Q6_K");
}

#[test]
fn q8_0_and_q4_1_round_trip_within_their_step() {
    let values: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32 - 30.0) / 17.0).collect();
    for (kind, step) in [(TensorType::Q8_0, 3.6 / 127.0), (TensorType::Q4_1, 3.8 / 15.0)] {
        let back = dequantize(kind, &quantize(kind, &values).unwrap(), values.len());
        for (a, b) in values.iter().zip(&back) {
            assert!((a - b).abs() <= step * 0.51 + 1e-3, "{kind:?}: {a} came back as {b}");
        }
    }
}

#[test]
fn a_written_file_reads_back() {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::Str("llama".into()))
        .meta("llama.block_count", Value::U64(2))
        .meta("tokenizer.ggml.tokens", Value::Array(vec![Value::Str("a".into()), Value::Str("b".into())]));
    let values: Vec<f32> = (0..96).map(|i| i as f32 / 10.0).collect();
    w.tensor("w", &[3, 32], TensorType::F32, &values).unwrap();
    w.tensor("q", &[3, 32], TensorType::Q8_0, &values).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("test.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.get("llama.block_count").and_then(Value::as_u64), Some(2));
    assert_eq!(g.tensors["w"].shape(), vec![3, 32]);
    assert_eq!(g.tensor_f32("w").unwrap(), values);
    let q = g.tensor_f32("q").unwrap();
    assert!(q.iter().zip(&values).all(|(a, b)| (a - b).abs() < 0.05));
}
