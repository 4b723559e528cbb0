//! The dequantisers against llama.cpp's own (the `gguf` Python package), on
//! random blocks of every type we read (`scripts/reference/gguf_blocks.py`),
//! and the reader on files the fixtures' writer makes.

use ragen_llm::gguf::{Gguf, TensorType, Value, dequantize};
use ragen_test_fixtures::gguf_writer::{GgufWriter, quantize};
use std::path::Path;

#[test]
fn every_block_type_dequantises_as_llama_cpp_does() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/reference/gguf_blocks.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; re-make it with scripts/reference/gguf_blocks.py", path.display()));
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 7, "one case per type");
    for case in cases {
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
        let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let expected: Vec<f32> = case["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let got = dequantize(kind, &bytes, expected.len());
        assert_eq!(got.len(), expected.len(), "{kind:?}");
        for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{kind:?} value {i}: {a} but llama.cpp gives {b}");
        }
    }
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
