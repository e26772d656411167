//! The demos' seeded generators: the same seed, the same numbers (the Python package relies
//! on it to print the Rust examples' losses), and what each promises about its numbers.

use tapejit::datasets::{make_moons, micrograd_params};

#[test]
fn make_moons_is_two_noisy_half_circles_and_the_same_for_a_seed() {
    let (points, labels) = make_moons(101, 0.0, 7);
    assert_eq!((points.len(), labels.len()), (101, 101));
    assert_eq!(labels.iter().filter(|&&y| y < 0.0).count(), 50);
    for (p, y) in points.iter().zip(&labels) {
        // Without noise, on the unit circle around (0, 0) or (1, 0.5).
        let (cx, cy) = if *y < 0.0 { (0.0, 0.0) } else { (1.0, 0.5) };
        let r = ((p[0] - cx).powi(2) + (p[1] - cy).powi(2)).sqrt();
        assert!((r - 1.0).abs() < 1e-12, "{p:?} {y}");
    }
    assert_eq!(make_moons(100, 0.1, 1337), make_moons(100, 0.1, 1337));
    assert_ne!(make_moons(100, 0.1, 1337), make_moons(100, 0.1, 1338));
}

#[test]
fn micrograd_params_are_uniform_weights_and_zero_biases_in_creation_order() {
    let params = micrograd_params(&[3, 2, 1], 5);
    assert_eq!(params.len(), 2 * 4 + 3);
    for (i, p) in params.iter().enumerate() {
        let bias = matches!(i, 3 | 7 | 10);
        assert!(
            if bias {
                *p == 0.0
            } else {
                (-1.0..1.0).contains(p)
            },
            "#{i}: {p}"
        );
    }
    assert_eq!(params, micrograd_params(&[3, 2, 1], 5));
}
