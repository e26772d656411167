//! The exported object's C header: its sizes and the declarations of `c_api.rs`'s functions.

use super::{ExportOptions, ExportParams, Layout};
use crate::optim::Optimizer;
use crate::tape::Tape;

/// The header of an object exported with `options` (prefix `p`) over `layout` for `machine`
/// (its triple and CPU); `built` is the program's tape as built (what the comments count).
pub(super) fn text(
    p: &str,
    layout: &Layout,
    options: &ExportOptions,
    optimizer: &Optimizer,
    built: &Tape,
    machine: (&str, &str),
) -> String {
    let upper = p.to_ascii_uppercase();
    let mut h = String::new();
    let mut line = |s: String| {
        h.push_str(&s);
        h.push('\n');
    };
    line(format!(
        "/* {p}: a tapejit program ({} nodes) exported by Jit::export (tapejit {}).",
        built.len(),
        env!("CARGO_PKG_VERSION")
    ));
    line(" * Link the object beside this header with -lm; it needs nothing else.".into());
    line(format!(
        " * Machine code for {}, CPU {}: it runs where that CPU's features are.",
        machine.0, machine.1
    ));
    line(" *".into());
    line(format!(
        " * Every function takes a workspace the caller owns: {upper}_WORKSPACE_DOUBLES"
    ));
    line(format!(
        " * doubles (8-byte aligned; 64 is best), set up once by {p}_init. A workspace is one"
    ));
    line(" * model's state: one thread at a time, as many workspaces as you like.".into());
    line(" * Nothing is checked: the lengths are the ones below. */".into());
    line(format!("#ifndef {upper}_H"));
    line(format!("#define {upper}_H"));
    line(String::new());
    line("#include <stdint.h>".into());
    line(String::new());
    line("#ifdef __cplusplus".into());
    line("extern \"C\" {".into());
    line("#endif".into());
    line(String::new());
    let define = |name: &str, value: usize, what: &str| {
        format!("#define {upper}_{name} {value} /* {what} */")
    };
    line(define(
        "WORKSPACE_DOUBLES",
        layout.workspace_doubles(),
        "doubles of the workspace",
    ));
    line(define(
        "NUM_INPUTS",
        layout.inputs.len(),
        "per sample, in the order they were created",
    ));
    line(define(
        "NUM_OUTPUTS",
        layout.outputs.len(),
        "in the order they were added",
    ));
    line(define(
        "NUM_PARAMS",
        layout.params.len(),
        "in the order they were created",
    ));
    line(define(
        "HAS_LOSS",
        layout.loss.is_some() as usize,
        "forward returns NaN without",
    ));
    line(String::new());
    line(
        "/* Writes the constants (and frozen params) into the workspace, every other number 0. */"
            .into(),
    );
    line(format!("void {p}_init(double *workspace);"));
    line(String::new());
    line(
        "/* Sets the inputs (NUM_INPUTS), runs forward, writes the outputs (NUM_OUTPUTS; NULL"
            .into(),
    );
    line(" * when there are none) and returns the loss. */".into());
    line(format!(
        "double {p}_forward(double *workspace, const double *inputs, double *outputs);"
    ));
    if options.params == ExportParams::Buffer {
        line(String::new());
        line(
            "/* The params (NUM_PARAMS), in the order they were created (Program::params). */"
                .into(),
        );
        line(format!(
            "void {p}_set_params(double *workspace, const double *params);"
        ));
        line(format!(
            "void {p}_get_params(const double *workspace, double *params);"
        ));
    }
    if options.training {
        line(String::new());
        line(format!(
            "/* Training by {} (the program's optimizer; its state lives in the workspace).",
            optimizer.name()
        ));
        line(
            " * step: sets the inputs, zeroes the params' gradients, runs forward and backward,"
                .into(),
        );
        line(
            " * updates every param at rate lr; returns the loss before the update. train: step"
                .into(),
        );
        line(
            " * on each of n samples (NUM_INPUTS numbers each, side by side), each loss into"
                .into(),
        );
        line(" * losses (NULL: not kept). */".into());
        line(format!(
            "double {p}_step(double *workspace, const double *inputs, double lr);"
        ));
        line(format!(
            "void {p}_train(double *workspace, const double *inputs, int64_t n, double lr, double *losses);"
        ));
    }
    line(String::new());
    line("#ifdef __cplusplus".into());
    line("}".into());
    line("#endif".into());
    line(format!("#endif /* {upper}_H */"));
    h
}
