//! [`Arith`] as LLVM IR: the JIT's instance of the op formulas.

use inkwell::builder::{Builder, BuilderError};
use inkwell::types::FloatType;
use inkwell::values::{FloatValue, FunctionValue};
use inkwell::FloatPredicate;

use super::lower::Emit;
use crate::op::Arith;

/// [`Arith`] over an LLVM builder: each method emits the one instruction (or libm call) the
/// interpreter performs. Builder errors (an unpositioned builder, a bug of ours) are kept and
/// reported by [`IrArith::finish`].
pub(super) struct IrArith<'a, 'ctx> {
    builder: &'a Builder<'ctx>,
    f64_type: FloatType<'ctx>,
    libm: &'a [FunctionValue<'ctx>; 4],
    error: Option<BuilderError>,
}

impl<'a, 'ctx> IrArith<'a, 'ctx> {
    /// An emitter at the builder's position; `libm` holds `exp`, `log`, `tanh`, `pow`.
    pub(super) fn new(
        builder: &'a Builder<'ctx>,
        f64_type: FloatType<'ctx>,
        libm: &'a [FunctionValue<'ctx>; 4],
    ) -> Self {
        IrArith {
            builder,
            f64_type,
            libm,
            error: None,
        }
    }

    pub(super) fn finish(self) -> Emit<()> {
        self.error.map_or(Ok(()), Err)
    }

    fn emit(&mut self, r: Emit<FloatValue<'ctx>>) -> FloatValue<'ctx> {
        r.unwrap_or_else(|e| {
            self.error.get_or_insert(e);
            self.f64_type.get_undef()
        })
    }

    fn call(&mut self, f: FunctionValue<'ctx>, args: &[FloatValue<'ctx>]) -> FloatValue<'ctx> {
        let args: Vec<_> = args.iter().map(|&a| a.into()).collect();
        let r = self.builder.build_call(f, &args, "").map(|c| {
            c.try_as_basic_value()
                .basic()
                .map(|v| v.into_float_value())
                .unwrap_or_else(|| self.f64_type.get_undef())
        });
        self.emit(r)
    }
}

impl<'ctx> Arith for IrArith<'_, 'ctx> {
    type V = FloatValue<'ctx>;
    fn constant(&mut self, c: f64) -> Self::V {
        self.f64_type.const_float(c)
    }
    fn add(&mut self, a: Self::V, b: Self::V) -> Self::V {
        let r = self.builder.build_float_add(a, b, "");
        self.emit(r)
    }
    fn sub(&mut self, a: Self::V, b: Self::V) -> Self::V {
        let r = self.builder.build_float_sub(a, b, "");
        self.emit(r)
    }
    fn mul(&mut self, a: Self::V, b: Self::V) -> Self::V {
        let r = self.builder.build_float_mul(a, b, "");
        self.emit(r)
    }
    fn div(&mut self, a: Self::V, b: Self::V) -> Self::V {
        let r = self.builder.build_float_div(a, b, "");
        self.emit(r)
    }
    fn neg(&mut self, a: Self::V) -> Self::V {
        let r = self.builder.build_float_neg(a, "");
        self.emit(r)
    }
    fn exp(&mut self, a: Self::V) -> Self::V {
        self.call(self.libm[0], &[a])
    }
    fn log(&mut self, a: Self::V) -> Self::V {
        self.call(self.libm[1], &[a])
    }
    fn tanh(&mut self, a: Self::V) -> Self::V {
        self.call(self.libm[2], &[a])
    }
    fn powf(&mut self, a: Self::V, c: f64) -> Self::V {
        let c = self.f64_type.const_float(c);
        self.call(self.libm[3], &[a, c])
    }
    fn select_gt(&mut self, a: Self::V, b: Self::V, then: Self::V, otherwise: Self::V) -> Self::V {
        let r = self
            .builder
            .build_float_compare(FloatPredicate::OGT, a, b, "")
            .and_then(|c| self.builder.build_select(c, then, otherwise, ""))
            .map(|v| v.into_float_value());
        self.emit(r)
    }
}
