//! Saved params, as [safetensors](https://huggingface.co/docs/safetensors) (what PyTorch,
//! numpy and candle read): `f64` tensors named from the model's structure, and metadata.
//!
//! For an MLP's architecture (its layer sizes, `[nin, h1, ..., nout]`) whose params are an
//! MLP's in creation order (neuron by neuron: its weights, then its bias), the tensors are
//! PyTorch's `nn.Linear` names and shapes: `layers.{l}.weight` (`[nout, nin]`, row per
//! neuron) and `layers.{l}.bias` (`[nout]`). Any other model's params are one tensor,
//! `params` (`[n]`, creation order). The metadata holds `format` (`tapejit`), the
//! `architecture` (`784-50-10`) and a `checksum` (FNV-1a 64 of the tensors' bytes, so that a
//! damaged file is an error rather than other numbers).
//!
//! Files of tapejit's first format (magic `TJPARAMS`: version, architecture as `u32`s,
//! params, FNV-1a 64 checksum, all little-endian) are still read.
//!
//! The architecture is whatever the saver says describes the model; [`Checkpoint::load_for`]
//! refuses a file saved for another one.

use std::collections::HashMap;
use std::path::Path;

use byteorder::{ByteOrder, LittleEndian};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{Error, Result};
use crate::optim::{Optimizer, State};
use crate::program::Program;

/// The first format's magic and version.
const MAGIC: &[u8; 8] = b"TJPARAMS";
const FIRST_VERSION: u32 = 1;

/// A model's architecture and its params, and the optimizer's state if it keeps one.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub architecture: Vec<usize>,
    pub params: Vec<f64>,
    pub optimizer: Option<SavedOptimizer>,
}

/// An optimizer's state as a checkpoint holds it: the optimizer's name
/// ([`crate::optim::Optimizer::name`]) and its [`State`], saved as the tensors
/// `optimizer.{buffer}` (`[n]`, creation order) and the metadata `optimizer` and
/// `optimizer_steps`.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedOptimizer {
    pub name: String,
    pub state: State,
}

/// Tensors named so hold the optimizer's buffers.
const OPTIMIZER_PREFIX: &str = "optimizer.";

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn describe(architecture: &[usize]) -> String {
    let parts: Vec<String> = architecture.iter().map(|s| s.to_string()).collect();
    parts.join("-")
}

impl Checkpoint {
    /// `program`'s params (creation order) and, if its optimizer keeps state (all but plain
    /// SGD), that state, as a model of `architecture`.
    pub fn of(program: &dyn Program, architecture: &[usize]) -> Checkpoint {
        let optimizer = program.optimizer();
        Checkpoint {
            architecture: architecture.to_vec(),
            params: program.params(),
            optimizer: (!optimizer.is_plain()).then(|| SavedOptimizer {
                name: optimizer.name().to_string(),
                state: program.optimizer_state(),
            }),
        }
    }

    /// Sets `program`'s params and its optimizer's state from this checkpoint (`file`
    /// names it in errors): both or neither. The optimizer must be the one saved (a plain
    /// SGD program takes a checkpoint without state).
    pub fn restore(&self, program: &mut dyn Program, file: &str) -> Result<()> {
        let bad = |problem: String| Error::Checkpoint {
            file: file.to_string(),
            problem,
        };
        let optimizer = program.optimizer();
        let saved = self.optimizer.as_ref().map(|s| s.name.as_str());
        match saved {
            Some(name) if name != optimizer.name() || optimizer.is_plain() => {
                return Err(bad(format!(
                    "holds the state of optimizer {name}, but this program's is {}",
                    describe_optimizer(&optimizer)
                )))
            }
            None if !optimizer.is_plain() => {
                return Err(bad(format!(
                    "holds no optimizer state, but this program's {} keeps one",
                    optimizer.name()
                )))
            }
            _ => {}
        }
        let (params, state) = (program.params(), program.optimizer_state());
        program.set_params(&self.params)?;
        if let Some(saved) = &self.optimizer {
            if let Err(e) = program.set_optimizer_state(&saved.state) {
                program.set_params(&params)?;
                program.set_optimizer_state(&state)?;
                return Err(e);
            }
        }
        Ok(())
    }

    /// The file's bytes (safetensors).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.encode().map_err(|problem| Error::Checkpoint {
            file: "(in memory)".into(),
            problem,
        })
    }

    /// The tensors' names, shapes and numbers (see the module's comment).
    fn tensors(&self) -> Vec<(String, Vec<usize>, Vec<f64>)> {
        let Some(layers) = mlp_layers(&self.architecture, self.params.len()) else {
            return vec![(
                "params".into(),
                vec![self.params.len()],
                self.params.clone(),
            )];
        };
        let mut out = Vec::new();
        let mut neurons = self.params.as_slice();
        for (l, (nin, nout)) in layers.into_iter().enumerate() {
            let (mut weight, mut bias) = (Vec::with_capacity(nin * nout), Vec::with_capacity(nout));
            for _ in 0..nout {
                let (neuron, rest) = neurons.split_at(nin + 1);
                weight.extend_from_slice(&neuron[..nin]);
                bias.push(neuron[nin]);
                neurons = rest;
            }
            out.push((format!("layers.{l}.weight"), vec![nout, nin], weight));
            out.push((format!("layers.{l}.bias"), vec![nout], bias));
        }
        out
    }

    /// The optimizer's buffers as tensors, after the params' (see [`SavedOptimizer`]).
    fn optimizer_tensors(&self) -> Vec<(String, Vec<usize>, Vec<f64>)> {
        let buffers = self.optimizer.iter().flat_map(|o| &o.state.buffers);
        buffers
            .map(|(name, xs)| {
                (
                    format!("{OPTIMIZER_PREFIX}{name}"),
                    vec![xs.len()],
                    xs.clone(),
                )
            })
            .collect()
    }

    fn encode(&self) -> std::result::Result<Vec<u8>, String> {
        let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = self
            .tensors()
            .into_iter()
            .chain(self.optimizer_tensors())
            .map(|(name, shape, xs)| {
                (
                    name,
                    shape,
                    xs.iter().flat_map(|x| x.to_le_bytes()).collect(),
                )
            })
            .collect();
        let views = tensors
            .iter()
            .map(|(name, shape, bytes)| {
                TensorView::new(Dtype::F64, shape.clone(), bytes).map(|v| (name.as_str(), v))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let mut metadata = HashMap::from([
            ("format".to_string(), "tapejit".to_string()),
            ("architecture".to_string(), describe(&self.architecture)),
            (
                "checksum".to_string(),
                format!("{:016x}", checksum(&tensors)),
            ),
        ]);
        if let Some(o) = &self.optimizer {
            metadata.insert("optimizer".into(), o.name.clone());
            metadata.insert("optimizer_steps".into(), o.state.steps.to_string());
        }
        safetensors::serialize(views, Some(metadata)).map_err(|e| e.to_string())
    }

    /// Parses a file's bytes (safetensors, or the first format); `file` names it in errors.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<Checkpoint> {
        let bad = |problem: String| Error::Checkpoint {
            file: file.to_string(),
            problem,
        };
        if bytes.starts_with(MAGIC) {
            return from_first_format(bytes).map_err(bad);
        }
        from_safetensors(bytes).map_err(bad)
    }

    /// Writes the file; an architecture the format cannot hold (see `to_bytes`) is refused
    /// before anything is written.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bad = |problem: String| Error::Checkpoint {
            file: path.display().to_string(),
            problem,
        };
        let bytes = self.encode().map_err(bad)?;
        std::fs::write(path, bytes).map_err(|e| bad(format!("cannot write: {e}")))
    }

    pub fn load(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| Error::Checkpoint {
            file: file.clone(),
            problem: format!("cannot read: {e}"),
        })?;
        Checkpoint::from_bytes(&bytes, &file)
    }

    /// Loads the params of a model of `architecture` with `params` params; a file saved for
    /// another architecture, or holding another number of params, is an error that names
    /// both.
    pub fn load_for(
        path: impl AsRef<Path>,
        architecture: &[usize],
        params: usize,
    ) -> Result<Vec<f64>> {
        let path = path.as_ref();
        let c = Checkpoint::load(path)?;
        let problem = if c.architecture != architecture {
            format!(
                "saved for architecture {}, but this model is {}",
                describe(&c.architecture),
                describe(architecture)
            )
        } else if c.params.len() != params {
            format!(
                "holds {} params, but this model has {params}",
                c.params.len()
            )
        } else {
            return Ok(c.params);
        };
        Err(Error::Checkpoint {
            file: path.display().to_string(),
            problem,
        })
    }
}

/// The layers `(nin, nout)` of an MLP of `architecture`'s sizes, if `params` is its count.
fn mlp_layers(architecture: &[usize], params: usize) -> Option<Vec<(usize, usize)>> {
    let layers: Vec<(usize, usize)> = architecture.windows(2).map(|w| (w[0], w[1])).collect();
    let count = layers.iter().try_fold(0usize, |n, &(nin, nout)| {
        nin.checked_add(1)?.checked_mul(nout)?.checked_add(n)
    });
    (!layers.is_empty() && count == Some(params)).then_some(layers)
}

/// The checksum of the tensors' bytes, in the order they were named.
fn checksum(tensors: &[(String, Vec<usize>, Vec<u8>)]) -> u64 {
    let bytes: Vec<u8> = tensors
        .iter()
        .flat_map(|(_, _, b)| b.iter().copied())
        .collect();
    fnv1a(&bytes)
}

/// A safetensors file this module wrote (or one with the same tensors and metadata).
fn from_safetensors(bytes: &[u8]) -> std::result::Result<Checkpoint, String> {
    let (_, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| format!("neither safetensors nor tapejit's first format ({e})"))?;
    let file =
        SafeTensors::deserialize(bytes).map_err(|e| format!("not valid safetensors: {e}"))?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let field = |key: &str| {
        metadata
            .get(key)
            .ok_or_else(|| format!("no {key:?} in the metadata: not a tapejit checkpoint"))
    };
    if field("format")? != "tapejit" {
        return Err(format!(
            "format {:?} in the metadata, expected \"tapejit\"",
            field("format")?
        ));
    }
    // Sizes first: a header may be 100 MB, and an MLP's architecture is expanded below into
    // a name and a shape per layer (some 160 bytes for each size of the text's 2 bytes). Its
    // file holds two tensors per layer. (Another model's file holds one tensor, `params`,
    // and its architecture is only parsed: 8 bytes a size.)
    let text = field("architecture")?;
    let sizes = text.split('-').count();
    let names = file.names();
    let model_tensors = names
        .iter()
        .filter(|n| !n.starts_with(OPTIMIZER_PREFIX))
        .count();
    let layers_at_most = model_tensors / 2 + 1;
    if !names.contains(&"params") && sizes > layers_at_most {
        return Err(format!(
            "an architecture of {sizes} sizes, but {model_tensors} tensors hold at most {layers_at_most}"
        ));
    }
    let architecture = parse_architecture(text)?;
    let want = u64::from_str_radix(field("checksum")?, 16)
        .map_err(|_| "a malformed checksum".to_string())?;
    let read = |name: &str, shape: &[usize]| -> std::result::Result<Vec<u8>, String> {
        let t = file
            .tensor(name)
            .map_err(|_| format!("no tensor {name:?}"))?;
        if t.dtype() != Dtype::F64 || t.shape() != shape {
            return Err(format!(
                "tensor {name:?} is {:?} {:?}, expected F64 {shape:?}",
                t.dtype(),
                t.shape()
            ));
        }
        Ok(t.data().to_vec())
    };
    // (Checked: an architecture's sizes are the file's to say.)
    let n_params = |names: &[(String, Vec<usize>)]| {
        (names.iter())
            .try_fold(0usize, |n, (_, s)| {
                n.checked_add(s.iter().try_fold(1usize, |a, &b| a.checked_mul(b))?)
            })
            .ok_or_else(|| "an architecture of more params than can be counted".to_string())
    };
    // The names and shapes this architecture's params would be saved under.
    let layout: Vec<(String, Vec<usize>)> = match file.names().contains(&"params") {
        true => {
            let t = file.tensor("params").map_err(|e| e.to_string())?;
            vec![("params".into(), t.shape().to_vec())]
        }
        false => (0..architecture.len().saturating_sub(1))
            .flat_map(|l| {
                let (nin, nout) = (architecture[l], architecture[l + 1]);
                [
                    (format!("layers.{l}.weight"), vec![nout, nin]),
                    (format!("layers.{l}.bias"), vec![nout]),
                ]
            })
            .collect(),
    };
    if model_tensors != layout.len() {
        return Err(format!(
            "{model_tensors} tensors, expected {}",
            layout.len()
        ));
    }
    // The optimizer's buffers, in the order its state lists them.
    let optimizer = match metadata.get("optimizer") {
        None => None,
        Some(name) => {
            let buffers = crate::optim::buffers_of(name)
                .ok_or_else(|| format!("an unknown optimizer {name:?}"))?;
            let steps = field("optimizer_steps")?
                .parse::<u64>()
                .map_err(|_| "a malformed optimizer_steps".to_string())?;
            Some((name.clone(), steps, buffers))
        }
    };
    // An optimizer's buffers, or none where its settings keep none (SGD without momentum).
    let present = names.len() - model_tensors;
    let buffers = (optimizer.iter())
        .flat_map(|(_, _, b)| b.iter())
        .filter(|_| present > 0);
    if present != buffers.clone().count() {
        return Err(format!(
            "{} optimizer tensors, expected {:?}",
            names.len() - model_tensors,
            buffers.collect::<Vec<_>>()
        ));
    }
    let n = n_params(&layout)?;
    let optimizer_layout = buffers.map(|b| (format!("{OPTIMIZER_PREFIX}{b}"), vec![n]));
    let tensors = layout
        .iter()
        .cloned()
        .chain(optimizer_layout)
        .map(|(name, shape)| Ok((name.clone(), shape.clone(), read(&name, &shape)?)))
        .collect::<std::result::Result<Vec<_>, String>>()?;
    if checksum(&tensors) != want {
        return Err("checksum mismatch: the file is corrupt".into());
    }
    let numbers =
        |b: &[u8]| -> Vec<f64> { b.chunks_exact(8).map(LittleEndian::read_f64).collect() };
    let (model, saved) = tensors.split_at(layout.len());
    let params = if layout.len() == 1 && layout[0].0 == "params" {
        numbers(&model[0].2)
    } else {
        // Back to creation order: each neuron's weights, then its bias.
        let mut params = Vec::with_capacity(n);
        for pair in model.chunks_exact(2) {
            let (weight, bias) = (numbers(&pair[0].2), numbers(&pair[1].2));
            let nin = pair[0].1[1];
            for (j, b) in bias.iter().enumerate() {
                params.extend_from_slice(&weight[j * nin..(j + 1) * nin]);
                params.push(*b);
            }
        }
        params
    };
    let optimizer = optimizer.map(|(name, steps, _)| SavedOptimizer {
        name,
        state: State {
            steps,
            buffers: saved
                .iter()
                .map(|(t, _, b)| (t[OPTIMIZER_PREFIX.len()..].to_string(), numbers(b)))
                .collect(),
        },
    });
    Ok(Checkpoint {
        architecture,
        params,
        optimizer,
    })
}

/// An optimizer as errors name it: `plain SGD`, or its name.
fn describe_optimizer(optimizer: &Optimizer) -> &'static str {
    match optimizer.is_plain() {
        true => "plain SGD (no state)",
        false => optimizer.name(),
    }
}

/// `784-50-10` back to sizes.
fn parse_architecture(text: &str) -> std::result::Result<Vec<usize>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split('-')
        .map(|n| {
            n.parse()
                .map_err(|_| format!("a malformed architecture {text:?}"))
        })
        .collect()
}

/// tapejit's first format (see the module's comment).
fn from_first_format(bytes: &[u8]) -> std::result::Result<Checkpoint, String> {
    if bytes.len() < 8 + 4 + 4 + 8 + 8 {
        return Err(format!("truncated: {} bytes", bytes.len()));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if fnv1a(body) != LittleEndian::read_u64(sum) {
        return Err("checksum mismatch: the file is corrupt or truncated".into());
    }
    let version = LittleEndian::read_u32(&body[8..]);
    if version != FIRST_VERSION {
        return Err(format!(
            "format version {version}, expected {FIRST_VERSION}"
        ));
    }
    let k = LittleEndian::read_u32(&body[12..]) as usize;
    let arch_end = k
        .checked_mul(4)
        .and_then(|b| b.checked_add(16))
        .filter(|&end| end.checked_add(8).is_some_and(|e| e <= body.len()))
        .ok_or_else(|| format!("header declares {k} architecture entries, beyond the file"))?;
    let architecture = body[16..arch_end]
        .chunks_exact(4)
        .map(|c| LittleEndian::read_u32(c) as usize)
        .collect();
    let n = LittleEndian::read_u64(&body[arch_end..]);
    let params_bytes = &body[arch_end + 8..];
    if n.checked_mul(8) != Some(params_bytes.len() as u64) {
        return Err(format!(
            "header declares {n} params but {} bytes of params follow",
            params_bytes.len()
        ));
    }
    let params = params_bytes
        .chunks_exact(8)
        .map(LittleEndian::read_f64)
        .collect();
    Ok(Checkpoint {
        architecture,
        params,
        optimizer: None,
    })
}
