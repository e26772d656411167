//! Numbers from `/proc/self/status`, for the examples that report resident memory.

/// `field`'s number (`"VmRSS:"`, `"RssAnon:"`, `"Threads:"` ...), in kB for the memory
/// fields; 0 where `/proc` or the field is missing.
pub fn field(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
