//! `weightlift load --model DIR`: a transformers model folder — which architecture (`config.json`), how many
//! parameters (the safetensors headers), and how long until every weight is in device memory.
//!
//! "Ready" here means the weights are loaded: every tensor of the checkpoint resident on the device, as the
//! tensors a Python model would take. Building the model object around them is Python's part
//! (`weightlift.transformers.from_pretrained`), which adds transformers' model construction to this time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use weightlift::format::TensorIndex;
use weightlift::{Device, Engine, LoadOpts};

use crate::load::{Args, manifest_checks, verify, with_progress};

/// What `config.json` says about the model (only what the report shows).
#[derive(Debug, PartialEq)]
pub struct ModelConfig {
    pub architectures: Vec<String>,
    pub model_type: Option<String>,
    pub dtype: Option<String>,
    pub layers: Option<u64>,
    pub hidden_size: Option<u64>,
    pub vocab_size: Option<u64>,
    /// transformers' default is to tie the output embedding to the input one.
    pub tie_word_embeddings: bool,
}

impl ModelConfig {
    pub fn parse(path: &Path, text: &str) -> Result<ModelConfig> {
        let v: Value = serde_json::from_str(text).with_context(|| format!("{}: not JSON", path.display()))?;
        let Some(obj) = v.as_object() else { bail!("{}: not a JSON object", path.display()) };
        let text_config = obj.get("text_config").and_then(Value::as_object);
        // Composite (vision-language) configs keep the language model's sizes under text_config.
        let num = |k: &str| obj.get(k).or_else(|| text_config.and_then(|t| t.get(k))).and_then(Value::as_u64);
        let architectures = match obj.get("architectures") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
            Some(_) => bail!("{}: \"architectures\" is not a list", path.display()),
        };
        Ok(ModelConfig {
            architectures,
            model_type: obj.get("model_type").and_then(Value::as_str).map(str::to_string),
            dtype: obj.get("dtype").or_else(|| obj.get("torch_dtype")).and_then(Value::as_str).map(str::to_string),
            layers: num("num_hidden_layers").or_else(|| num("n_layer")),
            hidden_size: num("hidden_size").or_else(|| num("n_embd")),
            vocab_size: num("vocab_size"),
            tie_word_embeddings: obj.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(true),
        })
    }

    /// Whether the output embedding (`lm_head.weight`) of this causal language model is the input embedding.
    fn ties_lm_head(&self) -> bool {
        let causal = self.architectures.iter().any(|a| a.ends_with("ForCausalLM") || a.ends_with("LMHeadModel"));
        causal && self.tie_word_embeddings
    }

    fn architecture(&self) -> String {
        match (self.architectures.first(), &self.model_type) {
            (Some(a), Some(t)) => format!("{a} ({t})"),
            (Some(a), None) => a.clone(),
            (None, Some(t)) => format!("model_type {t}"),
            (None, None) => "unknown (config.json names no architecture)".into(),
        }
    }
}

/// The weights of a model folder, by transformers' rule: `model.safetensors`, else the shards of
/// `model.safetensors.index.json`.
pub fn weights_of(dir: &Path) -> Result<PathBuf> {
    for name in ["model.safetensors", "model.safetensors.index.json"] {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    let other = ["pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "model.ckpt.index"]
        .into_iter()
        .find(|n| dir.join(n).exists());
    match other {
        Some(n) => bail!("{}: the weights are {n}; weightlift reads safetensors checkpoints", dir.display()),
        None => bail!("{}: no model.safetensors or model.safetensors.index.json", dir.display()),
    }
}

/// Parameters as stored: the elements of every tensor in the headers, per dtype.
pub fn parameters(index: &TensorIndex) -> BTreeMap<String, u64> {
    let mut by_dtype = BTreeMap::new();
    for t in &index.tensors {
        *by_dtype.entry(t.dtype.to_string()).or_insert(0) += t.elements();
    }
    by_dtype
}

pub fn run(dir: &Path, args: &Args) -> Result<()> {
    let start = Instant::now();
    let config_path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&config_path).with_context(|| format!("cannot read {}", config_path.display()))?;
    let config = ModelConfig::parse(&config_path, &text)?;
    let index = weightlift::format::open(&[weights_of(dir)?], None)?;
    let params = parameters(&index);
    let total: u64 = params.values().sum();
    let tied = config.ties_lm_head() && index.get("lm_head.weight").is_none();
    let (device, why) = args.engine.device()?;
    let engine = Engine::new(args.engine.settings()?)?;
    let checks = manifest_checks(&index, args.checksums)?;
    let mut loaded = with_progress(index.total_bytes(), |progress| {
        engine.load(
            &index,
            device,
            &LoadOpts { progress: Some(progress), checks: checks.as_ref(), ..LoadOpts::default() },
        )
    })?;
    let ready = start.elapsed().as_secs_f64();
    if args.verify {
        verify(&index, &loaded)?;
        loaded.report.verified = Some(true);
    }
    if args.json {
        let mut v = loaded.report.to_json();
        v["model"] = json!({
            "dir": dir, "architecture": config.architectures.first(), "model_type": config.model_type,
            "config_dtype": config.dtype, "layers": config.layers, "hidden_size": config.hidden_size,
            "vocab_size": config.vocab_size, "tied_embeddings": tied, "parameters": total,
            "parameters_by_dtype": params, "weights_ready_seconds": ready,
        });
        v["device_reason"] = why.into();
        println!("{v}");
        return Ok(());
    }
    println!("{}", summary(dir, &config, &params, tied, device, ready));
    println!("{}", loaded.report.summary());
    println!("  device: {why}");
    Ok(())
}

fn summary(
    dir: &Path,
    c: &ModelConfig,
    params: &BTreeMap<String, u64>,
    tied: bool,
    device: Device,
    ready: f64,
) -> String {
    let total: u64 = params.values().sum();
    let dtypes: Vec<String> = params.iter().map(|(d, n)| format!("{d} {}", count(*n))).collect();
    let shape: Vec<String> = [("layers", c.layers), ("hidden", c.hidden_size), ("vocab", c.vocab_size)]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k} {v}")))
        .collect();
    let mut s = format!("model {}: {}", dir.display(), c.architecture());
    if !shape.is_empty() {
        s += &format!(", {}", shape.join(", "));
    }
    s += &format!("\n  {} parameters ({})", count(total), dtypes.join(", "));
    if tied {
        s += "; lm_head tied to the input embedding (stored once)";
    }
    s += &format!(
        "\n  weights ready on {device} in {ready:.3} s (config, headers, engine set-up and load; the Python model \
         object is built by weightlift.transformers.from_pretrained)"
    );
    s
}

/// `1.24 B`, `22.7 M`, `5,120`.
fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} M", n as f64 / 1e6),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_fields_and_defaults() {
        let p = Path::new("config.json");
        let c = ModelConfig::parse(
            p,
            r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
                "num_hidden_layers": 16, "hidden_size": 2048, "vocab_size": 32000}"#,
        )
        .unwrap();
        assert_eq!(c.architecture(), "LlamaForCausalLM (llama)");
        assert_eq!((c.layers, c.hidden_size, c.vocab_size), (Some(16), Some(2048), Some(32000)));
        assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
        assert!(c.tie_word_embeddings);
        let gpt2 = ModelConfig::parse(
            p,
            r#"{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "tie_word_embeddings": false}"#,
        )
        .unwrap();
        assert_eq!((gpt2.layers, gpt2.hidden_size, gpt2.tie_word_embeddings), (Some(2), Some(64), false));
        assert_eq!(gpt2.architecture(), "model_type gpt2");
        let vlm = ModelConfig::parse(p, r#"{"architectures": null, "text_config": {"num_hidden_layers": 3}}"#).unwrap();
        assert_eq!(vlm.layers, Some(3));
        assert!(ModelConfig::parse(p, "[1]").is_err());
        assert!(ModelConfig::parse(p, r#"{"architectures": "Llama"}"#).is_err());
        assert!(ModelConfig::parse(p, "{").unwrap_err().to_string().contains("config.json"));
    }

    #[test]
    fn counts() {
        assert_eq!(count(5120), "5120");
        assert_eq!(count(22_700_000), "22.7 M");
        assert_eq!(count(1_235_814_400), "1.24 B");
    }
}
