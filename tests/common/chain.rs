//! The long chain of tests/large.rs, shared with examples/memory.rs: a graph of any size whose
//! values stay tame, cycling through every op.

// Each includer uses only part of it.
#![allow(dead_code)]

use tapejit::{Graph, Value};

/// The chain's input, and its params' initial values.
pub const X: f64 = 0.5;
pub const W0: f64 = 0.9;
pub const W1: f64 = 2.0;
/// Every `SUM_STRIDE`-th value of the chain also goes into one wide sum.
pub const SUM_STRIDE: usize = 10;
pub const SUM_WEIGHT: f64 = 1e-3;

/// One link of the chain. Applied in this order, over and over, each keeps the value in a
/// small range (no overflow, no domain error, relu off its kink), whatever the length.
#[derive(Clone, Copy, Debug)]
pub enum Link {
    MulParam0,
    AddConstant(f64),
    Tanh,
    ConstantTimes(f64),
    Sigmoid,
    LogOfShifted(f64),
    Exp,
    SubInput,
    DivParam1,
    Neg,
    ReluOfShifted(f64),
    Square,
}

pub const PATTERN: [Link; 12] = [
    Link::MulParam0,
    Link::AddConstant(0.1),
    Link::Tanh,
    Link::ConstantTimes(2.0),
    Link::Sigmoid,
    Link::LogOfShifted(0.5),
    Link::Exp,
    Link::SubInput,
    Link::DivParam1,
    Link::Neg,
    Link::ReluOfShifted(3.0),
    Link::Square,
];

/// The chain's leaves and ends.
pub struct Chain<'g> {
    pub x: Value<'g>,
    pub w: [Value<'g>; 2],
    pub loss: Value<'g>,
    pub links: usize,
}

/// `v = x; v = link(v)` for links cycling through `PATTERN` until the graph has about
/// `nodes` nodes; `loss = v + SUM_WEIGHT * sum(every SUM_STRIDE-th v)`.
pub fn build_chain(g: &Graph, nodes: usize) -> Chain<'_> {
    let x = g.input();
    let w = [g.param(W0), g.param(W1)];
    let mut v = x;
    let mut strided = Vec::new();
    let mut links = 0;
    while g.len() + 3 < nodes {
        v = match PATTERN[links % PATTERN.len()] {
            Link::MulParam0 => v * w[0],
            Link::AddConstant(c) => v + c,
            Link::Tanh => v.tanh(),
            Link::ConstantTimes(c) => c * v,
            Link::Sigmoid => v.sigmoid(),
            Link::LogOfShifted(c) => (v + c).log(),
            Link::Exp => v.exp(),
            Link::SubInput => v - x,
            Link::DivParam1 => v / w[1],
            Link::Neg => -v,
            Link::ReluOfShifted(c) => (v + c).relu(),
            Link::Square => v.powf(2.0),
        };
        links += 1;
        if links % SUM_STRIDE == 0 {
            strided.push(v);
        }
    }
    let loss = v + SUM_WEIGHT * g.sum(&strided);
    g.set_loss(loss).unwrap();
    Chain { x, w, loss, links }
}
