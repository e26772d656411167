//! `tapejit.compile(loss, inputs, params)`: the graph under `loss` built once and compiled,
//! for the loops that run it many times: `step(x, lr)` and `train(X, lr)` take numpy arrays
//! and run natively, without Python per node or per sample.

use std::collections::HashMap;

use numpy::{PyArray1, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Mutex, MutexGuard};

use tapejit::{Graph, Interpreter, Jit, Op, OptLevel, Program};

use crate::drop_in::{error, graph_of, linearize, position};
use crate::value::{flag, Value};

/// A leaf's part in a compiled graph.
#[derive(Clone, Copy)]
enum Role {
    Input(usize),
    Param(usize),
}

/// A graph compiled once: what `tapejit.compile` returns.
#[pyclass(name = "Program", module = "tapejit")]
pub struct Compiled {
    /// In a mutex only to be `Sync`, as Python objects are: every use is under the object's
    /// own borrow.
    program: Mutex<Box<dyn Program + Send>>,
    /// The params' `Value`s, in the program's order, for `sync`.
    params: Vec<Py<Value>>,
    /// The optimized IR, or why there is none.
    ir: Result<String, String>,
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
/// `ir()`. Every other leaf is a constant.
#[pyfunction]
#[pyo3(signature = (loss, inputs = Vec::new(), params = None, outputs = Vec::new(), opt = "O2", keep_ir = false))]
pub fn compile(
    py: Python<'_>,
    loss: Py<Value>,
    inputs: Vec<Py<Value>>,
    params: Option<Vec<Py<Value>>>,
    outputs: Vec<Py<Value>>,
    opt: &str,
    keep_ir: bool,
) -> PyResult<Compiled> {
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
            let p = in_graph(v, what, i)?;
            if roles.insert(p, role(i)).is_some() {
                return Err(PyValueError::new_err(format!(
                    "{what} #{i} is listed twice, or as an input and a param"
                )));
            }
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
    let leaf = |k: usize, v: &Value| match roles.get(&k) {
        Some(Role::Input(i)) => xs[*i],
        Some(Role::Param(i)) => ps[*i],
        None => g.constant(v.data.get()),
    };
    let nodes = graph_of(&g, &order, leaf, Some(&folds))?;
    let value = |k: usize| nodes[k].expect("outputs and the loss are not folded");
    for &p in &output_positions {
        g.add_output(value(p)).map_err(error)?;
    }
    g.set_loss(value(order.len() - 1)).map_err(error)?;
    let mut ir = Err("the interpreter has no IR".to_string());
    let program: Box<dyn Program + Send> = if opt == "interpreter" {
        Box::new(Interpreter::new(&g).map_err(error)?)
    } else {
        let level: OptLevel = opt.parse().map_err(|_| {
            PyValueError::new_err(format!(
                "opt={opt:?}: expected \"O0\", \"O1\", \"O2\", \"O3\" or \"interpreter\""
            ))
        })?;
        let jit = Jit::builder()
            .opt_level(level)
            .keep_ir(keep_ir)
            .compile(&g)
            .map_err(error)?;
        ir = jit.ir().map_err(|e| e.to_string());
        Box::new(jit)
    };
    Ok(Compiled {
        program: Mutex::new(program),
        params,
        ir,
    })
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

/// The leaves of `order` (the graph under `loss`, in the order they were made) that are
/// neither `inputs` nor numbers an operator met: where micrograd's `parameters()` lists them
/// for a model applied once. The Python objects come from the values that use them.
fn default_params(
    py: Python<'_>,
    loss: &Py<Value>,
    order: &[&Value],
    inputs: &[Py<Value>],
) -> Vec<Py<Value>> {
    let inputs: std::collections::HashSet<*const Value> =
        inputs.iter().map(|v| v.get() as *const Value).collect();
    let mut found: Vec<Option<Py<Value>>> = (0..order.len()).map(|_| None).collect();
    let mut offer = |p: &Py<Value>| {
        let v = p.get();
        if v.is_leaf() && !v.has(flag::CONSTANT) && !inputs.contains(&(v as *const Value)) {
            found[position(v)].get_or_insert_with(|| p.clone_ref(py));
        }
    };
    offer(loss);
    for v in order {
        v.prev().for_each(&mut offer);
    }
    found.into_iter().flatten().collect()
}

impl Compiled {
    fn program(&self) -> MutexGuard<'_, Box<dyn Program + Send>> {
        self.program.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl Compiled {
    /// One step of SGD on `x` (the inputs, in order): zero_grad, forward, backward, update
    /// at `lr`. Returns the loss before the update.
    fn step(&mut self, py: Python<'_>, x: &Bound<'_, PyAny>, lr: f64) -> PyResult<f64> {
        let x = numbers(x)?;
        let x = x
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let program = self.program.get_mut().unwrap_or_else(|e| e.into_inner());
        py.detach(|| program.step(x, lr)).map_err(error)
    }

    /// `step` on each sample of `X` (one row per sample, or the samples one after another),
    /// natively in one call. Returns each sample's loss.
    fn train<'py>(
        &mut self,
        py: Python<'py>,
        samples: &Bound<'py, PyAny>,
        lr: f64,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let x = numbers(samples)?;
        let x = x
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let program = self.program.get_mut().unwrap_or_else(|e| e.into_inner());
        let losses = py.detach(|| program.train(x, lr)).map_err(error)?;
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

    /// The optimized LLVM IR, if compiled with `keep_ir=True`.
    fn ir(&self) -> PyResult<String> {
        self.ir.clone().map_err(PyRuntimeError::new_err)
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
