//! `tapejit.compile(loss, inputs, params)`: the graph under `loss` built once and compiled,
//! for the loops that run it many times: `step(x, lr)` and `train(X, lr)` take numpy arrays
//! and run natively, without Python per node or per sample.

use std::collections::HashMap;

use numpy::{PyArray1, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{
    PyFloatingPointError, PyOSError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Mutex, MutexGuard};

use tapejit::checkpoint::Checkpoint;
use tapejit::optim::{Adam, AdamW, Optimizer, Sgd};
use tapejit::{
    ExportOptions, ExportParams, ExportTarget, Graph, Interpreter, Jit, Op, OptLevel, Program,
    Tape, Tiering,
};

use crate::drop_in::{error, graph_of, linearize, position};
use crate::samples::Stored;
use crate::tiers::{self, DropsWithoutGil};
use crate::value::{flag, Value};

/// A leaf's part in a compiled graph.
#[derive(Clone, Copy)]
enum Role {
    Input(usize),
    Param(usize),
}

/// What runs a compiled program: the JIT, in its tiers, or the interpreter
/// (`opt="interpreter"`).
enum Runner {
    Jit(Box<Jit>),
    Interpreter(Box<Interpreter>),
}

impl std::ops::Deref for Runner {
    type Target = dyn Program + Send;
    fn deref(&self) -> &Self::Target {
        match self {
            Runner::Jit(jit) => &**jit,
            Runner::Interpreter(interp) => &**interp,
        }
    }
}

impl std::ops::DerefMut for Runner {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Runner::Jit(jit) => &mut **jit,
            Runner::Interpreter(interp) => &mut **interp,
        }
    }
}

/// A graph compiled once: what `tapejit.compile` returns.
#[pyclass(name = "Program", module = "tapejit")]
pub struct Compiled {
    /// In a mutex only to be `Sync`, as Python objects are: every use is under the object's
    /// own borrow. Dropped without the GIL: a JIT dropped while its native compile is inside
    /// LLVM waits for the module it is on.
    program: Mutex<DropsWithoutGil<Runner>>,
    /// The params' `Value`s, in the program's order, for `sync`.
    params: Vec<Py<Value>>,
    /// The `tapejit.optim` optimizer given to `compile`, whose `lr` steps use by default.
    optimizer: Option<Py<PyAny>>,
    /// The optimized IR, or why there is none.
    ir: Result<String, String>,
    /// Per value of the loss's graph (in the order `linearize` gives): its node in the
    /// program's graph (none for an addition folded into a sum), for naming anomalies.
    nodes: Vec<Option<u32>>,
    /// What `compile` was given (the graph under the loss, the leaves' roles and the
    /// options): what a pickle holds, to compile again where it is loaded.
    recipe: Recipe,
}

/// `compile`'s arguments, the params as given (the defaults worked out).
struct Recipe {
    loss: Py<Value>,
    inputs: Vec<Py<Value>>,
    outputs: Vec<Py<Value>>,
    opt: String,
    keep_ir: bool,
    tiering: Tiering,
    /// The constants' numbers as compiled, in the order the graph meets them.
    constants: Vec<f64>,
}

/// `x` as a contiguous slice of `f64`s (a copy only if numpy must make one).
fn numbers<'py>(x: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArrayDyn<'py, f64>> {
    if let Ok(array) = x.extract::<PyReadonlyArrayDyn<'py, f64>>() {
        if array.is_c_contiguous() {
            return Ok(array);
        }
    }
    let np = x.py().import("numpy")?;
    let array = np.call_method1("ascontiguousarray", (x, "float64"))?;
    array.extract::<PyReadonlyArrayDyn<'py, f64>>()
}

/// Compiles the graph under `loss`. `inputs`: the leaves `step` and `train` fill, in order;
/// `params`: the leaves they train (default: every leaf that is not an input and was not a
/// number an operator met); `outputs`: values whose numbers `outputs()` returns after each
/// forward; `opt`: `"O0"`..`"O3"`, or `"interpreter"`; `keep_ir`: keep the optimized IR for
/// `ir()` (native code then compiles before `compile` returns); `optimizer`: a
/// `tapejit.optim` optimizer (default plain SGD at the rate each step is given);
/// `tiering`: `"auto"` (the JIT's first tier at once, native code when it is ready),
/// `"off"` (native code before `compile` returns) or `"first_tier_only"`. Every other leaf
/// is a constant.
#[pyfunction]
#[pyo3(signature = (loss, inputs = Vec::new(), params = None, outputs = Vec::new(), opt = "O2", keep_ir = false, optimizer = None, tiering = "auto"))]
#[allow(clippy::too_many_arguments)]
pub fn compile(
    py: Python<'_>,
    loss: Py<Value>,
    inputs: Vec<Py<Value>>,
    params: Option<Vec<Py<Value>>>,
    outputs: Vec<Py<Value>>,
    opt: &str,
    keep_ir: bool,
    optimizer: Option<Py<PyAny>>,
    tiering: &str,
) -> PyResult<Compiled> {
    let recipe = (
        loss,
        inputs,
        params,
        outputs,
        opt.to_string(),
        keep_ir,
        optimizer,
    );
    compile_with(py, recipe, tiering, None)
}

/// [`compile`]'s arguments (params maybe defaulted), the constants' numbers given (in the
/// order the graph meets its constant leaves) or, `None`, the leaves' as they are now.
fn compile_with(
    py: Python<'_>,
    (loss, inputs, params, outputs, opt, keep_ir, optimizer): Recipe7<Option<Vec<Py<Value>>>>,
    tiering: &str,
    constants: Option<&[f64]>,
) -> PyResult<Compiled> {
    let opt = opt.as_str();
    let tiering = tiers::tiering(tiering)?;
    if keep_ir && tiering == Tiering::FirstTierOnly {
        return Err(PyValueError::new_err(
            "keep_ir=True keeps native code's IR, and tiering=\"first_tier_only\" compiles \
             none",
        ));
    }
    let rust_optimizer = match &optimizer {
        Some(o) => optimizer_of(o.bind(py))?,
        None => Optimizer::default(),
    };
    if let Some(o) = &optimizer {
        // Its settings but `lr` are read here, once: the optimizer refuses changes to them
        // from now on (`optim.py`), so that no copy of this program reads other ones.
        o.bind(py).setattr(pyo3::intern!(py, "_compiled"), true)?;
    }
    let root = loss.get();
    let (order, _) = linearize(py, root).map_err(|v| {
        PyValueError::new_err(format!(
            "the loss's graph holds a value whose backward is a Python function (op {:?}, \
             made by Value(data, children, op) or given a _backward), which native code \
             cannot run: build the op from Value's operators and methods to compile it, or \
             train with loss.backward(), which runs such a graph by micrograd's algorithm",
            v._op()
        ))
    })?;
    let reaches = |v: &Value| order.get(position(v)).is_some_and(|&w| std::ptr::eq(w, v));
    let in_graph = |v: &Value, what: &str, i: usize| -> PyResult<usize> {
        let p = position(v);
        match order.get(p) {
            Some(&w) if std::ptr::eq(w, v) => Ok(p),
            _ => Err(PyValueError::new_err(format!(
                "{what} #{i} is not in the loss's graph (a value of another graph, or one \
                 the loss does not depend on)"
            ))),
        }
    };
    let params: Vec<Py<Value>> = match params {
        Some(p) => p,
        None => default_params(py, &loss, &order, &inputs),
    };
    let mut roles: HashMap<usize, Role> = HashMap::new();
    let mut listed = std::collections::HashSet::new();
    for (what, list, role) in [
        ("input", &inputs, Role::Input as fn(usize) -> Role),
        ("param", &params, Role::Param as fn(usize) -> Role),
    ] {
        for (i, v) in list.iter().enumerate() {
            let v = v.get();
            if !v.is_leaf() {
                return Err(PyValueError::new_err(format!(
                    "{what} #{i} is not a leaf: inputs and params are Value(x)s"
                )));
            }
            if !listed.insert(v as *const Value) {
                return Err(PyValueError::new_err(format!(
                    "{what} #{i} is listed twice, or as an input and a param"
                )));
            }
            // A param the loss does not depend on is still trained (its gradient 0), as
            // PyTorch takes one; an input must feed the loss.
            match role(i) {
                Role::Param(_) if !reaches(v) => continue,
                _ => roles.insert(in_graph(v, what, i)?, role(i)),
            };
        }
    }
    let output_positions = outputs
        .iter()
        .enumerate()
        .map(|(i, v)| in_graph(v.get(), "output", i))
        .collect::<PyResult<Vec<_>>>()?;

    let folds = chains(&order, &output_positions);
    let g = Graph::new();
    let xs = g.inputs_without_grad(inputs.len());
    let ps: Vec<_> = params.iter().map(|p| g.param(p.get().data.get())).collect();
    // The constants' numbers, as `constants` gives them or as they are now (which a pickle
    // keeps: the leaves may change after this call, the compiled program does not).
    let mut snapshot = Vec::new();
    let leaf = |k: usize, v: &Value| match roles.get(&k) {
        Some(Role::Input(i)) => xs[*i],
        Some(Role::Param(i)) => ps[*i],
        None => {
            let x = constants
                .and_then(|c| c.get(snapshot.len()).copied())
                .unwrap_or(v.data.get());
            snapshot.push(x);
            g.constant(x)
        }
    };
    let nodes = graph_of(&g, &order, leaf, Some(&folds))?;
    let node_ids = nodes.iter().map(|n| n.map(|n| n.id())).collect();
    let value = |k: usize| nodes[k].expect("outputs and the loss are not folded");
    for &p in &output_positions {
        g.add_output(value(p)).map_err(error)?;
    }
    g.set_loss(value(order.len() - 1)).map_err(error)?;
    let mut ir = Err("the interpreter has no IR".to_string());
    let program = if opt == "interpreter" {
        let mut interp = Interpreter::new(&g).map_err(error)?;
        interp.set_optimizer(rust_optimizer).map_err(error)?;
        Runner::Interpreter(Box::new(interp))
    } else {
        let level: OptLevel = opt.parse().map_err(|_| {
            PyValueError::new_err(format!(
                "opt={opt:?}: expected \"O0\", \"O1\", \"O2\", \"O3\" or \"interpreter\""
            ))
        })?;
        let builder = Jit::builder()
            .opt_level(level)
            .keep_ir(keep_ir)
            .optimizer(rust_optimizer)
            .tiering(tiering);
        let tape = Tape::from_graph(&g).map_err(error)?;
        // (Without the GIL: with tiering "off" or keep_ir, LLVM compiles here.)
        let jit = py
            .detach(move || builder.compile_tape(tape))
            .map_err(error)?;
        ir = jit.ir().map_err(|e| e.to_string());
        Runner::Jit(Box::new(jit))
    };
    Ok(Compiled {
        program: Mutex::new(DropsWithoutGil::new(program)),
        params,
        optimizer,
        ir,
        nodes: node_ids,
        recipe: Recipe {
            loss,
            inputs,
            outputs,
            opt: opt.to_string(),
            keep_ir,
            tiering,
            constants: snapshot,
        },
    })
}

/// A pickled program back: `compile` of its recipe and tiering with the constants' numbers
/// it was compiled with, then its params and optimizer state. (The tiering and the
/// constants are arguments of their own, not in the recipe, so that a pickle made before
/// there were any loads: the default tiering, the leaves' numbers.)
#[pyfunction]
#[pyo3(signature = (recipe, values, state, tiering = "auto", constants = None))]
pub fn restore_program(
    py: Python<'_>,
    recipe: Recipe7,
    values: &Bound<'_, PyAny>,
    state: &Bound<'_, PyDict>,
    tiering: &str,
    constants: Option<Vec<f64>>,
) -> PyResult<Compiled> {
    let (loss, inputs, params, outputs, opt, keep_ir, optimizer) = recipe;
    let recipe = (loss, inputs, Some(params), outputs, opt, keep_ir, optimizer);
    let mut program = compile_with(py, recipe, tiering, constants.as_deref())?;
    program.set_params(values)?;
    program.set_optimizer_state(state)?;
    Ok(program)
}

/// A recipe as a pickle holds it (`compile`'s arguments in order; `P`, the params, maybe
/// left to their default).
type Recipe7<P = Vec<Py<Value>>> = (
    Py<Value>,
    Vec<Py<Value>>,
    P,
    Vec<Py<Value>>,
    String,
    bool,
    Option<Py<PyAny>>,
);

/// The Rust optimizer of a `tapejit.optim` one (its `_settings()`: a name and a dict).
fn optimizer_of(o: &Bound<'_, PyAny>) -> PyResult<Optimizer> {
    let not_one = || {
        PyTypeError::new_err(format!(
            "optimizer={}: expected a tapejit.optim optimizer (SGD, Adam or AdamW)",
            o.repr().map_or("?".into(), |r| r.to_string())
        ))
    };
    let (name, settings): (String, Bound<'_, PyDict>) = o
        .call_method0("_settings")
        .and_then(|s| s.extract())
        .map_err(|_| not_one())?;
    let number = |key: &str| -> PyResult<f64> {
        settings
            .get_item(key)?
            .ok_or_else(not_one)?
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("optimizer {key} must be a number")))
    };
    let betas = || -> PyResult<(f64, f64)> {
        settings
            .get_item("betas")?
            .ok_or_else(not_one)?
            .extract()
            .map_err(|_| PyTypeError::new_err("optimizer betas must be two numbers"))
    };
    let optimizer = match name.as_str() {
        "sgd" => Optimizer::Sgd(Sgd {
            momentum: number("momentum")?,
            dampening: number("dampening")?,
            nesterov: settings
                .get_item("nesterov")?
                .ok_or_else(not_one)?
                .is_truthy()?,
            weight_decay: number("weight_decay")?,
        }),
        "adam" => Optimizer::Adam(Adam {
            betas: betas()?,
            eps: number("eps")?,
            weight_decay: number("weight_decay")?,
        }),
        "adamw" => Optimizer::AdamW(AdamW {
            betas: betas()?,
            eps: number("eps")?,
            weight_decay: number("weight_decay")?,
        }),
        _ => return Err(not_one()),
    };
    Ok(optimizer)
}

/// `export`'s `target=`: `"host"`, `"generic"`, `"TRIPLE"` or `"TRIPLE:CPU"` (the CPU
/// `"generic"` if not given); anything else is a `ValueError`. (Whether the linked LLVM has
/// the triple and CPU is `export`'s to say.)
fn export_target(name: &str) -> PyResult<ExportTarget> {
    match name {
        "host" => return Ok(ExportTarget::Host),
        "generic" => return Ok(ExportTarget::Generic),
        _ => {}
    }
    let (triple, cpu) = name.split_once(':').unwrap_or((name, "generic"));
    let word = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    if !word(triple) || !word(cpu) {
        return Err(PyValueError::new_err(format!(
            "target={name:?}: expected \"host\", \"generic\", a target triple \
             (\"x86_64-unknown-linux-gnu\") or a triple and a CPU \
             (\"x86_64-unknown-linux-gnu:znver3\")"
        )));
    }
    Ok(ExportTarget::Named {
        triple: triple.to_string(),
        cpu: cpu.to_string(),
    })
}

/// `export`'s `params=` (`None`: frozen, or a buffer for training); another name is a
/// `ValueError`.
fn export_params(name: Option<&str>, training: bool) -> PyResult<ExportParams> {
    match name {
        None if training => Ok(ExportParams::Buffer),
        None | Some("frozen") => Ok(ExportParams::Frozen),
        Some("buffer") => Ok(ExportParams::Buffer),
        Some(name) => Err(PyValueError::new_err(format!(
            "params={name:?}: expected \"frozen\" or \"buffer\""
        ))),
    }
}

/// An export's error: a file that cannot be written is an `OSError`, any other refusal a
/// `ValueError`, with tapejit's message.
fn export_error(e: tapejit::Error) -> PyErr {
    match &e {
        tapejit::Error::Export { problem } if problem.starts_with("cannot write") => {
            PyOSError::new_err(e.to_string())
        }
        _ => error(e),
    }
}

/// Per node of `order` (the loss last): whether it is an addition whose one use is as the
/// first operand of the next addition, and not an output: [`graph_of`] folds such chains,
/// `((a + b) + c) + d` (what Python's `sum` builds), into one `Sum` of their terms, the
/// shape loop recovery rolls (to the recovery a binary chain is a node per term, a sum one
/// node).
fn chains(order: &[&Value], outputs: &[usize]) -> Vec<bool> {
    let mut uses = vec![0u32; order.len()];
    for v in order {
        for p in v.prev() {
            uses[position(p.get())] += 1;
        }
    }
    for &o in outputs {
        uses[o] += 1;
    }
    let mut folds = vec![false; order.len()];
    for v in order.iter().filter(|v| v.op == Some(Op::Add)) {
        let left = position(v.prev().next().expect("two operands").get());
        folds[left] = order[left].op == Some(Op::Add) && uses[left] == 1;
    }
    folds
}

/// The leaves of `order` (the graph under `loss`, in the order they were made; the loss
/// last) a user means as params: neither `inputs` nor numbers an operator met, and not a
/// leaf of which the loss is an affine function with constant coefficients (one it only
/// adds, maybe scaled by numbers: a running sum's `Value(0.0)` start, a constant written as
/// `Value(c)`), whose gradient is a constant: training it would move the loss by itself
/// and never the model (plain SGD would lower the loss without end). In the order
/// micrograd's `parameters()` lists them for a model applied once. The Python objects
/// come from the values that use them.
fn default_params(
    py: Python<'_>,
    loss: &Py<Value>,
    order: &[&Value],
    inputs: &[Py<Value>],
) -> Vec<Py<Value>> {
    let inputs: std::collections::HashSet<*const Value> =
        inputs.iter().map(|v| v.get() as *const Value).collect();
    // Per node: whether it is a number (made of numbers an operator met), and whether the
    // loss's gradient with respect to it depends on the values (not affine).
    let mut number = vec![false; order.len()];
    for (k, v) in order.iter().enumerate() {
        number[k] = match v.op {
            None => v.has(flag::CONSTANT),
            Some(_) => v.prev().all(|p| number[position(p.get())]),
        };
    }
    let mut varies = vec![false; order.len()];
    for (k, v) in order.iter().enumerate().rev() {
        let operands: Vec<usize> = v.prev().map(|p| position(p.get())).collect();
        for (i, &o) in operands.iter().enumerate() {
            let others_are_numbers = operands
                .iter()
                .enumerate()
                .all(|(j, &p)| j == i || number[p]);
            let affine = match v.op {
                Some(Op::Add | Op::Sub | Op::Neg | Op::Sum) => true,
                Some(Op::Mul) => others_are_numbers,
                Some(Op::Div) => i == 0 && others_are_numbers,
                Some(Op::Powf(c)) => c == 1.0,
                _ => false,
            };
            varies[o] |= varies[k] || !affine;
        }
    }
    let mut found: Vec<Option<Py<Value>>> = (0..order.len()).map(|_| None).collect();
    let mut offer = |p: &Py<Value>| {
        let v = p.get();
        let k = position(v);
        let constant = v.has(flag::CONSTANT);
        if v.is_leaf() && !constant && !inputs.contains(&(v as *const Value)) && varies[k] {
            found[k].get_or_insert_with(|| p.clone_ref(py));
        }
    };
    offer(loss);
    for v in order {
        v.prev().for_each(&mut offer);
    }
    found.into_iter().flatten().collect()
}

impl Compiled {
    fn program(&self) -> MutexGuard<'_, DropsWithoutGil<Runner>> {
        self.program.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `e`, an anomaly's graph node told as the value of the loss's graph it is (and where
    /// it was made, which anomaly mode records).
    fn in_terms_of_values(&self, py: Python<'_>, e: tapejit::Error) -> PyErr {
        let tapejit::Error::Anomaly { node: Some(n), .. } = &e else {
            return error(e);
        };
        let Some(k) = self.nodes.iter().position(|&m| m == Some(*n)) else {
            return error(e);
        };
        let Ok((order, _)) = linearize(py, self.recipe.loss.get()) else {
            return error(e);
        };
        let v = order[k];
        let made_at = crate::anomaly::made_at(v.serial());
        PyFloatingPointError::new_err(format!("{e}: the value {}{made_at}", v.__repr__()))
    }

    /// The rate a step runs at: `lr` if given, else the optimizer's `lr` (read at every
    /// call, so that a schedule may set it between steps).
    fn rate(&self, py: Python<'_>, lr: Option<f64>) -> PyResult<f64> {
        match (lr, &self.optimizer) {
            (Some(lr), _) => Ok(lr),
            (None, Some(o)) => o
                .bind(py)
                .getattr("lr")?
                .extract()
                .map_err(|_| PyTypeError::new_err("the optimizer's lr must be a number")),
            (None, None) => Err(PyTypeError::new_err(
                "a learning rate is needed: step(x, lr), or compile with an optimizer",
            )),
        }
    }
}

#[pymethods]
impl Compiled {
    /// One step on `x` (the inputs, in order): zero_grad, forward, backward, and the
    /// optimizer's update (plain SGD without one) at `lr`, or at the optimizer's `lr` if not
    /// given. Returns the loss before the update.
    #[pyo3(signature = (x, lr = None))]
    fn step(&mut self, py: Python<'_>, x: &Bound<'_, PyAny>, lr: Option<f64>) -> PyResult<f64> {
        let lr = self.rate(py, lr)?;
        let x = numbers(x)?;
        let x = x
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let program = self.program.get_mut().unwrap_or_else(|e| e.into_inner());
        program.detect_anomaly(crate::anomaly::on());
        let done = py.detach(|| program.step(x, lr));
        done.map_err(|e| self.in_terms_of_values(py, e))
    }

    /// `step` on each sample of `X` (one row per sample, or the samples one after another),
    /// natively in one call, at `lr` (the optimizer's if not given). Returns each sample's
    /// loss. `X` as it is stored: float64, float32 (widened), or uint8 (as it is, or divided
    /// by `divide`: `divide=255.0` scales pixels to [0, 1]); `labels` (integers below
    /// `classes`) one-hot after each row's inputs; `order`: the rows to train on, in order
    /// (a shuffled epoch without a shuffled copy). The call converts each sample where it
    /// trains on it, giving the bits of `train` on the same numbers as float64.
    #[pyo3(signature = (samples, lr = None, *, divide = None, labels = None, classes = None, order = None))]
    #[allow(clippy::too_many_arguments)]
    fn train<'py>(
        &mut self,
        py: Python<'py>,
        samples: &Bound<'py, PyAny>,
        lr: Option<f64>,
        divide: Option<f64>,
        labels: Option<&Bound<'py, PyAny>>,
        classes: Option<usize>,
        order: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let lr = self.rate(py, lr)?;
        let stored = Stored::extract(samples, divide, labels, classes, order)?;
        let inputs = self.program().tape().num_inputs();
        let samples = stored.samples(inputs)?;
        let program = self.program.get_mut().unwrap_or_else(|e| e.into_inner());
        program.detect_anomaly(crate::anomaly::on());
        let done = py.detach(|| program.train_from(&samples, lr));
        let losses = done.map_err(|e| self.in_terms_of_values(py, e))?;
        Ok(PyArray1::from_vec(py, losses))
    }

    /// Minibatch SGD on the samples (taken as `train` takes them): minibatches of `batch`
    /// samples, each moving every param by `lr` times their mean gradient, on `threads`
    /// threads (0: one per core; at most one per core). The same bits on every thread count. Returns each sample's
    /// loss.
    #[pyo3(signature = (samples, batch, lr = None, threads = 0, *, divide = None, labels = None, classes = None, order = None))]
    #[allow(clippy::too_many_arguments)]
    fn train_minibatches<'py>(
        &mut self,
        py: Python<'py>,
        samples: &Bound<'py, PyAny>,
        batch: usize,
        lr: Option<f64>,
        threads: usize,
        divide: Option<f64>,
        labels: Option<&Bound<'py, PyAny>>,
        classes: Option<usize>,
        order: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let lr = self.rate(py, lr)?;
        let stored = Stored::extract(samples, divide, labels, classes, order)?;
        let inputs = self.program().tape().num_inputs();
        let samples = stored.samples(inputs)?;
        let program = self.program.get_mut().unwrap_or_else(|e| e.into_inner());
        let done = py.detach(|| program.train_minibatches_from(&samples, batch, lr, threads));
        let losses = done.map_err(|e| self.in_terms_of_values(py, e))?;
        Ok(PyArray1::from_vec(py, losses))
    }

    /// The loss on `x` (the inputs, in order; the last ones if not given), and the outputs'
    /// values for `outputs()`.
    #[pyo3(signature = (x = None))]
    fn forward(&mut self, x: Option<&Bound<'_, PyAny>>) -> PyResult<f64> {
        if let Some(x) = x {
            let x = numbers(x)?;
            let x = x
                .as_slice()
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            self.program().set_inputs(x).map_err(error)?;
        }
        Ok(self.program().forward())
    }

    /// The outputs' values as of the last forward (of `forward`, `step` or `train`'s last
    /// sample).
    fn outputs<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        PyArray1::from_vec(py, self.program().outputs())
    }

    /// The params, in the order they were given.
    #[getter]
    fn params<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        PyArray1::from_vec(py, self.program().params())
    }

    #[setter]
    fn set_params(&mut self, values: &Bound<'_, PyAny>) -> PyResult<()> {
        let values = numbers(values)?;
        let values = values
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.program().set_params(values).map_err(error)
    }

    /// The params' gradients as of the last backward (`step`'s, or `train`'s last sample's).
    #[getter]
    fn grads<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        PyArray1::from_vec(py, self.program().param_grads())
    }

    /// Writes the params and their gradients into the params' `Value`s (`data`, `grad`), so
    /// the model's objects show what training reached.
    fn sync(&self) {
        let program = self.program();
        let (values, grads) = (program.params(), program.param_grads());
        for ((p, v), g) in self.params.iter().zip(values).zip(grads) {
            p.get().set_number(v, false);
            p.get().grad.set(g);
        }
    }

    /// Writes a checkpoint (safetensors, as `tapejit::checkpoint` writes): the params and,
    /// if the optimizer keeps state, its moments and step count. `architecture`: the sizes
    /// of an MLP whose params these are (then named as PyTorch's `nn.Linear`s), or none.
    #[pyo3(signature = (path, architecture = Vec::new()))]
    fn save(&self, py: Python<'_>, path: &str, architecture: Vec<usize>) -> PyResult<()> {
        let checkpoint = Checkpoint::of(&***self.program(), &architecture);
        py.detach(|| checkpoint.save(path)).map_err(error)
    }

    /// Reads a checkpoint `save` wrote (or the Rust trainer's): its params and optimizer
    /// state, both or neither. One of another count of params, or holding another
    /// optimizer's state (or none where this program's optimizer keeps one), is a
    /// `ValueError`.
    fn load(&mut self, py: Python<'_>, path: &str) -> PyResult<()> {
        let checkpoint = py.detach(|| Checkpoint::load(path)).map_err(error)?;
        let program = self.program.get_mut().unwrap_or_else(|e| e.into_inner());
        let n = program.tape().num_params();
        if checkpoint.params.len() != n {
            return Err(PyValueError::new_err(format!(
                "{path}: holds {} params, but this program has {n}",
                checkpoint.params.len()
            )));
        }
        checkpoint.restore(&mut ***program, path).map_err(error)
    }

    /// Writes this program as a relocatable object file at `path` (a str or `os.PathLike`)
    /// and a C header beside it (`path` with the extension `.h`): a C program links the
    /// object (`cc main.c model.o -lm`; no LLVM, Python or Rust at run time) and computes
    /// the bits this program computes. The header declares, `P` being `prefix` (a C
    /// identifier): `P_WORKSPACE_DOUBLES`, `P_NUM_INPUTS`, `P_NUM_OUTPUTS`, `P_NUM_PARAMS`;
    /// `void P_init(double *ws)`, once per workspace (`P_WORKSPACE_DOUBLES` numbers the
    /// caller owns); `double P_forward(ws, inputs, outputs)`, the loss (NaN without one) and
    /// the outputs. `target`: `"host"` (this CPU and its features), `"generic"` (the host's
    /// architecture at its baseline) or `"TRIPLE"` / `"TRIPLE:CPU"`. `params`: `"frozen"`
    /// (the params as of this call, in the object) or `"buffer"` (the caller's:
    /// `P_set_params(ws, params)`, `P_get_params(ws, params)`, in the order `params` gives).
    /// `training=True` (params in a buffer) also exports `double P_step(ws, inputs, lr)` and
    /// `void P_train(ws, inputs, n, lr, losses)` by the program's optimizer, `P_init`
    /// writing its state as of this call. Returns `{"object", "header"}` (paths),
    /// `"workspace_doubles"`, `"object_bytes"` and `"secs"`. A bad prefix, target or
    /// request is a `ValueError`; a path that cannot be written an `OSError`. LLVM compiles
    /// the object here, without the GIL.
    #[pyo3(signature = (path, prefix = "model", target = "host", params = None, training = false))]
    fn export<'py>(
        &mut self,
        py: Python<'py>,
        path: std::path::PathBuf,
        prefix: &str,
        target: &str,
        params: Option<&str>,
        training: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let options = ExportOptions::new(prefix)
            .target(export_target(target)?)
            .training(training)
            .params(export_params(params, training)?);
        let program = self.program.get_mut().unwrap_or_else(|e| e.into_inner());
        let runner: &mut Runner = program;
        let exported = py.detach(|| match runner {
            Runner::Jit(jit) => jit.export(&path, &options),
            // The interpreter's tape, params and optimizer in a JIT that compiles no native
            // code: what the export compiles is its own.
            Runner::Interpreter(interp) => {
                let mut jit = Jit::builder()
                    .tiering(Tiering::FirstTierOnly)
                    .compile_tape(interp.tape().clone())?;
                jit.set_params(&interp.params())?;
                jit.set_optimizer(interp.optimizer())?;
                jit.set_optimizer_state(&interp.optimizer_state())?;
                jit.export(&path, &options)
            }
        });
        let exported = exported.map_err(export_error)?;
        let dict = PyDict::new(py);
        dict.set_item("object", exported.object.into_os_string())?;
        dict.set_item("header", exported.header.into_os_string())?;
        dict.set_item("workspace_doubles", exported.workspace_doubles)?;
        dict.set_item("object_bytes", exported.object_bytes)?;
        dict.set_item("secs", exported.secs)?;
        Ok(dict)
    }

    /// The optimizer given to `compile` (`None`: plain SGD).
    #[getter]
    fn optimizer(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.optimizer.as_ref().map(|o| o.clone_ref(py))
    }

    /// The optimizer's state: `{"step": steps taken, buffer name: numpy array (one number
    /// per param, in order), ...}` (PyTorch's names: `exp_avg`, `exp_avg_sq`,
    /// `momentum_buffer`); plain SGD keeps none (`{"step": 0}`).
    #[getter]
    fn optimizer_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = self.program().optimizer_state();
        let dict = PyDict::new(py);
        dict.set_item("step", state.steps)?;
        for (name, xs) in state.buffers {
            dict.set_item(name, PyArray1::from_vec(py, xs))?;
        }
        Ok(dict)
    }

    #[setter]
    fn set_optimizer_state(&mut self, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let mut buffers = Vec::new();
        let mut steps = 0;
        for (key, value) in state.iter() {
            let key: String = key.extract()?;
            if key == "step" {
                steps = value.extract()?;
                continue;
            }
            let xs = numbers(&value)?;
            let xs = xs
                .as_slice()
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            buffers.push((key, xs.to_vec()));
        }
        let program = self.program.get_mut().unwrap_or_else(|e| e.into_inner());
        // In the optimizer's order, whatever the dict's.
        let names = program.optimizer().buffer_names();
        buffers.sort_by_key(|(n, _)| names.iter().position(|m| m == n));
        let state = tapejit::optim::State { steps, buffers };
        program.set_optimizer_state(&state).map_err(error)
    }

    /// Pickles as its graph (the `Value`s under the loss), the leaves' roles, its options
    /// (the tiering too), params and optimizer state: loading compiles it again (LLVM's code
    /// is not portable between processes) and puts the params and state back, so a process
    /// pool can ship a program and get back one that continues where it left off.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let r = &self.recipe;
        let clone = |vs: &[Py<Value>]| vs.iter().map(|v| v.clone_ref(py)).collect::<Vec<_>>();
        let recipe = (
            r.loss.clone_ref(py),
            clone(&r.inputs),
            clone(&self.params),
            clone(&r.outputs),
            r.opt.clone(),
            r.keep_ir,
            self.optimizer.as_ref().map(|o| o.clone_ref(py)),
        );
        let restore = py.import("tapejit._tapejit")?.getattr("restore_program")?;
        let tiering = tiers::tiering_name(r.tiering);
        let state = self.optimizer_state(py)?;
        let args = (recipe, self.params(py), state, tiering, r.constants.clone());
        Ok((restore, args.into_pyobject(py)?.into_any()))
    }

    /// The optimized LLVM IR, if compiled with `keep_ir=True`.
    fn ir(&self) -> PyResult<String> {
        self.ir.clone().map_err(PyRuntimeError::new_err)
    }

    /// The tier that runs the next call: `"first_tier"` (the JIT's first tier, while native
    /// code compiles), `"native"`, or `"interpreter"` (`opt="interpreter"`). Native code
    /// takes over at the start of a call that recomputes every value (`step`, `train`,
    /// `forward`) once its compile is done.
    #[getter]
    fn tier(&self) -> &'static str {
        match &**self.program() {
            Runner::Jit(jit) => tiers::tier_name(jit.tier()),
            Runner::Interpreter(_) => "interpreter",
        }
    }

    /// The `tiering` given to `compile`.
    #[getter]
    fn tiering(&self) -> &'static str {
        tiers::tiering_name(self.recipe.tiering)
    }

    /// Waits, without the GIL, for native code compiling in the background, and switches to
    /// it; returns at once where none compiles (tiering `"off"` or `"first_tier_only"`, or
    /// the interpreter). A native compile that failed is a `RuntimeError` (the program goes
    /// on in the first tier, which computes the same numbers).
    fn wait_for_native(&mut self, py: Python<'_>) -> PyResult<()> {
        let program = self.program.get_mut().unwrap_or_else(|e| e.into_inner());
        let Runner::Jit(jit) = &mut **program else {
            return Ok(());
        };
        let waited = py.detach(|| jit.wait_for_native());
        // (A failure a call met first is in the stats.)
        match waited.err().or_else(|| jit.stats().native_error.clone()) {
            None => Ok(()),
            Some(e) => Err(PyRuntimeError::new_err(format!(
                "native code did not compile ({e}): the first tier runs on, with the same \
                 numbers"
            ))),
        }
    }

    /// The JIT's stats: which tier ran how many passes (`first_tier_passes`,
    /// `native_passes`), when native code took over (`native_after_secs`, `None` until then
    /// and with tiering `"off"`), why it never will (`native_error`), and what compiling
    /// took. Empty for the interpreter.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match &**self.program() {
            Runner::Jit(jit) => tiers::stats(py, jit.stats()),
            Runner::Interpreter(_) => Ok(PyDict::new(py)),
        }
    }

    #[getter]
    fn num_inputs(&self) -> usize {
        self.program().tape().num_inputs()
    }

    #[getter]
    fn num_params(&self) -> usize {
        self.program().tape().num_params()
    }

    fn __repr__(&self) -> String {
        let program = self.program();
        let tape = program.tape();
        format!(
            "Program({} tape nodes, {} inputs, {} params)",
            tape.len(),
            tape.num_inputs(),
            tape.num_params()
        )
    }
}
