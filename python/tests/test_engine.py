"""micrograd's test/test_engine.py with only the import changed, its PyTorch results written
in (float64, as the test computes them), and the README's example."""

from tapejit import Value


def test_sanity_check():

    x = Value(-4.0)
    z = 2 * x + 2 + x
    q = z.relu() + z * x
    h = (z * z).relu()
    y = h + q + q * x
    y.backward()
    xmg, ymg = x, y

    # forward pass went well
    assert ymg.data == -20.0
    # backward pass went well
    assert xmg.grad == 46.0


def test_more_ops():

    a = Value(-4.0)
    b = Value(2.0)
    c = a + b
    d = a * b + b**3
    c += c + 1
    c += 1 + c + (-a)
    d += d * 2 + (b + a).relu()
    d += 3 * d + (b - a).relu()
    e = c - d
    f = e**2
    g = f / 2.0
    g += 10.0 / f
    g.backward()
    amg, bmg, gmg = a, b, g

    tol = 1e-6
    # forward pass went well
    assert abs(gmg.data - 24.70408163265306) < tol
    # backward pass went well
    assert abs(amg.grad - 138.83381924198252) < tol
    assert abs(bmg.grad - 645.5772594752186) < tol


def test_readme_example_prints_micrographs_numbers():
    a = Value(-4.0)
    b = Value(2.0)
    c = a + b
    d = a * b + b**3
    c += c + 1
    c += 1 + c + (-a)
    d += d * 2 + (b + a).relu()
    d += 3 * d + (b - a).relu()
    e = c - d
    f = e**2
    g = f / 2.0
    g += 10.0 / f
    assert f'{g.data:.4f}' == '24.7041'
    g.backward()
    assert f'{a.grad:.4f}' == '138.8338'
    assert f'{b.grad:.4f}' == '645.5773'
    # micrograd's own digits, to the last.
    assert (g.data, a.grad, b.grad) == (24.70408163265306, 138.83381924198252, 645.5772594752186)
