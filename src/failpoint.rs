//! Crash points for tests. Built with the `failpoints` feature, `PAGOS_CRASH_AT=<name>`
//! aborts the process at that step, as a SIGKILL would, and `PAGOS_PANIC_AT=<name>` panics
//! there, as a bug in that step would: the task that hit it ends, the process goes on.
//! Without the feature, nothing.

#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    use std::sync::OnceLock;
    static AT: OnceLock<[Option<String>; 2]> = OnceLock::new();
    let [crash, panic] =
        AT.get_or_init(|| ["PAGOS_CRASH_AT", "PAGOS_PANIC_AT"].map(|var| std::env::var(var).ok()));
    if crash.as_deref() == Some(name) {
        eprintln!("pagos: failpoint {name}: aborting");
        std::process::abort();
    }
    if panic.as_deref() == Some(name) {
        panic!("pagos: failpoint {name}: panicking");
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}
