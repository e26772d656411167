//! What the examples' flags share: value parsers for clap.

/// A number above 0 (a learning rate, a count).
pub fn positive<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + Default,
    T::Err: std::fmt::Display,
{
    let x: T = s.parse().map_err(|e| format!("{e}"))?;
    if x > T::default() {
        Ok(x)
    } else {
        Err(format!("{s} is not above 0"))
    }
}

/// A learning rate: a finite number above 0.
pub fn learning_rate(s: &str) -> Result<f64, String> {
    let lr: f64 = positive(s)?;
    if lr.is_finite() {
        Ok(lr)
    } else {
        Err(format!("{s} is not finite"))
    }
}
