//! The dequantisers against llama.cpp's own (the `gguf` Python package), on
//! random blocks of every type we read (`scripts/reference/gguf_blocks.py`).

use ragen_llm::gguf::{TensorType, dequantize};
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
