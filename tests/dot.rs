//! Graphviz pictures: every node of a small graph with its op, data and gradient, and a large
//! graph summarised by the structure loop recovery finds.

use rand::rngs::StdRng;
use rand::SeedableRng;
use tapejit::dot::{program_to_dot, MAX_NODES};
use tapejit::nn::{self, MLP};
use tapejit::{Graph, Interpreter, Jit, Program};

fn neuron(g: &Graph) {
    let x = g.inputs(2);
    let w = [g.param(0.5), g.param(-0.25)];
    let b = g.param(0.125);
    let y = (w[0] * x[0] + w[1] * x[1] + b).tanh();
    g.set_loss(y).unwrap();
}

#[test]
fn a_small_graph_shows_every_node_and_edge() {
    let g = Graph::new();
    neuron(&g);
    let dot = tapejit::dot::graph_to_dot(&g).unwrap();
    assert!(dot.starts_with("digraph tape {") && dot.trim_end().ends_with('}'));
    let boxes = dot.lines().filter(|l| l.contains("[label=")).count();
    let edges = dot.lines().filter(|l| l.contains("->")).count();
    // 2 inputs, 3 params, 2 products, 2 additions, tanh.
    assert_eq!((boxes, edges), (10, 9), "{dot}");
    assert!(dot.contains("param 0 | data 0.5 }"), "{dot}");
    assert!(dot.contains("{ tanh (loss) }"), "{dot}");

    for mut p in [
        Box::new(Interpreter::new(&g).unwrap()) as Box<dyn Program>,
        Box::new(Jit::compile(&g).unwrap()),
    ] {
        p.set_inputs(&[1.0, 2.0]).unwrap();
        p.forward();
        p.backward().unwrap();
        let dot = program_to_dot(p.as_ref());
        // tanh(0.5 - 0.5 + 0.125), and its gradient 1 at the loss.
        assert!(
            dot.contains("tanh (loss) | data 0.1244 | grad 1 }"),
            "{dot}"
        );
        assert_eq!(dot.lines().filter(|l| l.contains("| grad")).count(), 10);
    }
}

#[test]
fn a_large_graph_is_summarised_by_its_loops() {
    // A batch of 50 copies of an MLP sharing its params, as micrograd's moons demo builds it.
    let g = Graph::new();
    let model = MLP::new(&g, 2, &[8, 1], &mut StdRng::seed_from_u64(1));
    let x = g.inputs_without_grad(100);
    let y = g.inputs_without_grad(50);
    let scores: Vec<_> = x.chunks(2).map(|xi| model.call(xi).unwrap()[0]).collect();
    let loss = nn::max_margin(&scores, &y, &model.params(), 1e-4).unwrap();
    g.set_loss(loss).unwrap();
    let p = Interpreter::new(&g).unwrap();
    assert!(p.tape().len() > MAX_NODES);
    let dot = tapejit::dot::graph_to_dot(&g).unwrap();
    assert!(dot.lines().count() < 40, "{dot}");
    assert!(dot.contains("nest: 50 x"), "{dot}");
    assert!(
        dot.contains("{ inputs | 150 }") && dot.contains("params |"),
        "{dot}"
    );
    assert!(dot.contains("| loss"), "{dot}");
    assert!(dot.contains("->"));
}
