//! A tape's structure as bytes: everything compiled code can depend on, and nothing else.
//! What the JIT's persistent cache keys on (`jit/cache/`), so that two tapes that write the
//! same bytes compile to the same machine code.
//!
//! Written: every stored node's op ([`Op::key`]: a constant's and an exponent's every bit),
//! its operands and its two gradient flags (needs one; compiled code adds into it), the
//! counts of params and inputs, each param's slot, the outputs and the loss, and a batch's
//! copies as stored ([`super::Copies`]). Left out, because code never reads them: the params'
//! initial values (they are the buffers' first contents, `Tape::for_each_initial_value`),
//! which graph the tape came from and its graph node -> slot map (what `Program` methods look
//! values up by), and the consumers counted on demand.
//!
//! Each list is written after its length, so no two tapes write the same bytes. The fields
//! are taken apart exhaustively: a new field of [`Tape`] does not compile until it is written
//! here or said to be left out.

use super::{Tape, TapeNode};

/// How many bytes are handed to `write` at a time.
const CHUNK: usize = 1 << 16;

impl Tape {
    /// Hands the tape's structure (module docs) to `write`, in pieces.
    pub(crate) fn write_structure(&self, write: &mut dyn FnMut(&[u8])) {
        let Tape {
            graph_id: _,
            nodes,
            args,
            num_params,
            num_inputs,
            param_init: _,
            param_slots,
            outputs,
            loss,
            slot_of: _,
            consumers: _,
            copies,
        } = self;
        let mut out = Bytes::new(write);
        out.u64(nodes.len() as u64);
        for &TapeNode {
            op,
            args_start,
            args_len_and_grad,
        } in nodes
        {
            let [kind, field] = op.key();
            out.u64(kind);
            out.u64(field);
            out.u32(args_start);
            out.u32(args_len_and_grad);
        }
        out.u32s(args.iter().map(|s| s.0), args.len());
        out.u64(*num_params as u64);
        out.u64(*num_inputs as u64);
        out.u32s(param_slots.iter().map(|s| s.0), param_slots.len());
        out.u32s(outputs.iter().map(|s| s.0), outputs.len());
        out.u32s(loss.iter().map(|s| s.0), loss.iter().len());
        match copies {
            None => out.u32(0),
            Some(c) => {
                out.u32(1);
                c.write_structure(&mut out);
            }
        }
        out.flush();
    }
}

/// Little-endian numbers, gathered into chunks for `write`.
pub(super) struct Bytes<'w> {
    write: &'w mut dyn FnMut(&[u8]),
    buf: Vec<u8>,
}

impl<'w> Bytes<'w> {
    fn new(write: &'w mut dyn FnMut(&[u8])) -> Self {
        Bytes {
            write,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        if self.buf.len() + bytes.len() > CHUNK {
            self.flush();
        }
        self.buf.extend_from_slice(bytes);
    }

    fn flush(&mut self) {
        (self.write)(&self.buf);
        self.buf.clear();
    }

    pub(super) fn u32(&mut self, x: u32) {
        self.put(&x.to_le_bytes());
    }

    pub(super) fn u64(&mut self, x: u64) {
        self.put(&x.to_le_bytes());
    }

    /// `len`, then the `len` numbers of `xs`.
    pub(super) fn u32s(&mut self, xs: impl Iterator<Item = u32>, len: usize) {
        self.u64(len as u64);
        xs.for_each(|x| self.u32(x));
    }

    /// `len`, then the `len` numbers of `xs`.
    pub(super) fn i64s(&mut self, xs: impl Iterator<Item = i64>, len: usize) {
        self.u64(len as u64);
        xs.for_each(|x| self.u64(x as u64));
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::Graph;
    use crate::tape::Tape;

    fn structure(tape: &Tape) -> Vec<u8> {
        let mut bytes = Vec::new();
        tape.write_structure(&mut |b| bytes.extend_from_slice(b));
        bytes
    }

    /// `w * x + c`, with `w` starting at `init`; a batch of 4 copies of a small net if
    /// `copies`.
    fn tape(init: f64, c: f64, copies: bool) -> Tape {
        let g = Graph::new();
        let w = g.param(init);
        let b = g.param(0.25);
        let terms: Vec<_> = (0..if copies { 4 } else { 1 })
            .map(|_| {
                let x = g.inputs(3);
                let h: Vec<_> = x.iter().map(|&xi| (w * xi + b).tanh() * c).collect();
                g.sum(h.iter().copied()).powf(2.0)
            })
            .collect();
        g.set_loss(g.sum(terms)).unwrap();
        Tape::from_graph(&g).unwrap()
    }

    #[test]
    fn param_values_are_not_structure_but_constants_and_copies_are() {
        let base = structure(&tape(0.5, 3.0, false));
        assert_eq!(base, structure(&tape(-7.0, 3.0, false)));
        assert_ne!(base, structure(&tape(0.5, 3.0000000000000004, false)));
        let copies = tape(0.5, 3.0, true);
        assert!(copies.copies().is_some(), "the test's batch is stored once");
        assert_eq!(structure(&copies), structure(&tape(2.0, 3.0, true)));
        assert_ne!(
            structure(&copies),
            structure(&copies.clone().without_copies())
        );
    }

    #[test]
    fn a_param_layout_changes_the_structure() {
        let t = tape(0.5, 3.0, false);
        let moved = t.with_param_layout(&[1, 0]).unwrap();
        assert_ne!(structure(&t), structure(&moved));
    }
}
