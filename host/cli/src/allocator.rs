//! The allocator: mimalloc instead of the system's, told to keep the memory
//! it frees.
//!
//! Training allocates and frees tensors of tens of megabytes every pass.
//! glibc's malloc hands such blocks back to the kernel each time, and
//! mimalloc by default a second later, so each pass met fresh pages again
//! and paid for the page faults and the kernel zeroing them. Keeping freed
//! memory leaves the process's peak memory as it was; it only holds on to
//! it until it exits. The measurements are in docs/notebook.md ("A pool per
//! pass, memory kept, and token scores in one kernel") and the reasoning in
//! docs/design.md ("The policy and the learner").

/// The process's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The environment variable that sets how long mimalloc keeps freed memory
/// before handing it back to the kernel, in milliseconds (-1: never).
const PURGE_DELAY: &str = "MIMALLOC_PURGE_DELAY";

/// Restarts this process with mimalloc told to keep freed memory
/// (`MIMALLOC_PURGE_DELAY=-1`), unless the variable is already set (by the
/// user, or by this restart).
///
/// mimalloc reads its options only when the process loads, and setting one
/// later is an `unsafe` foreign call, which this workspace forbids, so the
/// option goes in through the environment of an `exec` of the same program
/// with the same arguments. If that `exec` fails, the run goes on with
/// mimalloc's default.
#[cfg(unix)]
pub fn keep_freed_memory() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os(PURGE_DELAY).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    // `exec` returns only on failure.
    let _failed = std::process::Command::new(&exe).arg0(arg0).args(args).env(PURGE_DELAY, "-1").exec();
}

/// Elsewhere the run keeps mimalloc's default.
#[cfg(not(unix))]
pub fn keep_freed_memory() {}
