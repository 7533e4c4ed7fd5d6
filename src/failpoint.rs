//! Crash points for tests. Built with the `failpoints` feature, `PAGOS_CRASH_AT=<name>`
//! aborts the process at that step, as a SIGKILL would. Without the feature, nothing.

#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    use std::sync::OnceLock;
    static AT: OnceLock<Option<String>> = OnceLock::new();
    let at = AT.get_or_init(|| std::env::var("PAGOS_CRASH_AT").ok());
    if at.as_deref() == Some(name) {
        eprintln!("pagos: failpoint {name}: aborting");
        std::process::abort();
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}
