//! Crash points for tests. Built with the `failpoints` feature, `PAGOS_CRASH_AT=<name>`
//! aborts the process at that step, as a SIGKILL would, and `PAGOS_PANIC_AT=<name>` panics
//! there, as a bug in that step would: the task that hit it ends, the process goes on.
//! `PAGOS_PAUSE_AT=<name>:<millis>[,<name>:<millis>…]` holds the task that reaches a
//! `pause` point that long, as a slow statement or a descheduled process would, so a test
//! can run another writer inside that window. `PAGOS_CLOCK_STEP=<millis>:<after millis>`
//! steps this process's wall clock ([`crate::db::wall`]) by `millis` (negative: back) once
//! it has run `after millis`, as a host clock set by hand would. Without the feature,
//! nothing.

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

#[cfg(feature = "failpoints")]
pub async fn pause(name: &str) {
    use std::sync::OnceLock;
    static AT: OnceLock<Vec<(String, u64)>> = OnceLock::new();
    let at = AT.get_or_init(|| {
        std::env::var("PAGOS_PAUSE_AT")
            .unwrap_or_default()
            .split(',')
            .filter_map(|point| {
                let (name, millis) = point.split_once(':')?;
                Some((name.to_owned(), millis.parse().ok()?))
            })
            .collect()
    });
    if let Some((_, millis)) = at.iter().find(|(at, _)| at == name) {
        eprintln!("pagos: failpoint {name}: pausing {millis} ms");
        tokio::time::sleep(std::time::Duration::from_millis(*millis)).await;
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub async fn pause(_name: &str) {}

#[cfg(feature = "failpoints")]
pub fn clock_step() -> chrono::TimeDelta {
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};
    static STEP: OnceLock<Option<(i64, Instant)>> = OnceLock::new();
    let step = STEP.get_or_init(|| {
        let raw = std::env::var("PAGOS_CLOCK_STEP").ok()?;
        let (millis, after) = raw.split_once(':')?;
        let after = Duration::from_millis(after.parse().ok()?);
        Some((millis.parse().ok()?, Instant::now() + after))
    });
    match step {
        Some((millis, from)) if Instant::now() >= *from => chrono::TimeDelta::milliseconds(*millis),
        _ => chrono::TimeDelta::zero(),
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn clock_step() -> chrono::TimeDelta {
    chrono::TimeDelta::zero()
}
