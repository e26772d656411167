//! What the benchmark examples (`report`, `families`) share to print their tables: medians,
//! number formats and the commit measured.

/// The median (NaN of nothing).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Three significant digits without an exponent: `1234`, `85.2`, `0.0312`.
pub fn significant(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let decimals = 2 - x.abs().log10().floor() as i32;
    format!("{x:.*}", decimals.max(0) as usize)
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: impl std::fmt::Display) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The commit measured (`abc1234`, `+ uncommitted changes` if the tree differs), if git
/// knows it.
pub fn code_version() -> Option<String> {
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short", "HEAD"])?;
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty {
        format!("{commit} + uncommitted changes")
    } else {
        commit
    })
}
