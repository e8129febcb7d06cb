//! The agent's guard, on Linux: the process the runtime spawns forks the
//! agent and stays behind as its guard, so that nothing the agent started
//! outlives the runtime, even when the runtime is killed with SIGKILL.
//!
//! The kernel's parent-death signal reaches one process only: the one that
//! asked for it. A compound target (`cd x && python3 agent.py`) keeps a shell
//! between the runtime and the agent, and agents start processes of their
//! own. The guard leads the agent's process group and is a child subreaper,
//! so every descendant stays its descendant; when the runtime dies, the
//! guard's parent-death signal makes it kill the whole group. Otherwise it
//! only waits, and leaves with the agent's own exit status, so the runtime
//! sees the agent's exit as before.

//!
//! The system calls go through `rustix`, which makes them directly and
//! allocates nothing, so they may run between `fork` and `exec`. What
//! `rustix` keeps behind its unstable `runtime` feature (`fork`, signal
//! masks, `sigwaitinfo`, `_exit`, `close_range`) is called through `libc`,
//! each in an `unsafe` block that says why it is sound.

use rustix::process::{Pid, Resource, Rlimit, Signal, WaitOptions, WaitStatus};
use rustix::thread::CapabilitySet;

/// Signal the guard gets when the runtime dies, or when the runtime
/// stops an agent that does not stop by itself.
pub const RUNTIME_DIED: Signal = Signal::USR1;

/// Capabilities that open a process that is not dumpable (see
/// [`hide_memory`]): each lets its holder read the runtime's memory.
const MEMORY_READING_CAPABILITIES: [CapabilitySet; 3] = [CapabilitySet::SYS_PTRACE, CapabilitySet::SYS_ADMIN, CapabilitySet::PERFMON];
const MEMORY_READING_SET: CapabilitySet = CapabilitySet::SYS_PTRACE
    .union(CapabilitySet::SYS_ADMIN)
    .union(CapabilitySet::PERFMON);

/// Takes [`MEMORY_READING_SET`] out of this process's inheritable set.
/// Async-signal-safe: two system calls on values on the stack.
fn clear_inheritable() {
    if let Ok(mut sets) = rustix::thread::capabilities(None) {
        sets.inheritable.remove(MEMORY_READING_SET);
        let _ = rustix::thread::set_capabilities(None, sets);
    }
}

/// The calling thread's children, as the kernel lists them
/// (`CONFIG_PROC_CHILDREN`). The guard is single-threaded, so for it
/// these are the process's children.
const CHILDREN: &std::ffi::CStr = c"/proc/thread-self/children";

/// Says once, in the log, when the kernel cannot list a process's
/// children ([`CHILDREN`]): the guard then cannot find what left the
/// agent's process group.
pub fn check_support() {
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        if !std::path::Path::new(CHILDREN.to_str().expect("the path is ASCII")).exists() {
            tracing::warn!(
                "this kernel does not list a process's children (/proc/<pid>/task/<tid>/children): processes an agent starts outside its process group may outlive it"
            );
        }
    });
}

/// Makes the runtime's memory, and that of every guard it forks, closed
/// to its agents. The guard is a fork of the runtime that never execs,
/// so both hold the runtime's whole environment (its API keys among
/// it), which an agent of the same user could otherwise read from
/// `/proc/<pid>/environ` or `/proc/<pid>/mem`, whatever environment it
/// was given itself. A process that is not dumpable opens those files
/// only to processes with `CAP_SYS_PTRACE` (or `CAP_SYS_ADMIN`,
/// `CAP_PERFMON`). It also writes no core dump.
pub fn hide_memory() {
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
}

/// Runs in the spawned process before exec: returns in the agent (which
/// then execs the target), never returns in the guard.
///
/// # Safety
///
/// Call only between `fork` and `exec` (a `pre_exec` hook), where only
/// async-signal-safe functions may run: `runtime` is the pid of the
/// process that spawned this one.
pub unsafe fn split(runtime: u32, limits: super::AgentLimits) -> std::io::Result<()> {
    let guard = rustix::process::getpid();
    // SAFETY: the caller's contract (# Safety above): this process has one
    // thread, and what follows in either process makes only
    // async-signal-safe calls, which allocate nothing and take no lock.
    let agent = unsafe { libc::fork() };
    if agent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let Some(agent) = Pid::from_raw(agent) else {
        // The agent: it dies with its guard.
        if rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).is_err() || rustix::process::getppid() != Some(guard) {
            exit_now(1);
        }
        // An agent run as root would otherwise read the runtime's and the
        // guard's memory despite `hide_memory`: each of these capabilities
        // opens a process that is not dumpable. Out of its bounding set, the
        // agent cannot get them back when it execs. Refused (and harmless)
        // for an agent that is not root.
        for cap in MEMORY_READING_CAPABILITIES {
            let _ = rustix::thread::remove_capability_from_bounding_set(cap);
        }
        // An exec as root also grants what the ambient and inheritable sets hold.
        let _ = rustix::thread::clear_ambient_capability_set();
        clear_inheritable();
        // No core dump either: a crashing agent would write its whole memory.
        lower_limit(Resource::Core, Some(0), 0);
        lower_limit(Resource::Data, limits.memory_bytes, 0);
        // The hard limit a second later: SIGXCPU first, which an agent may report.
        lower_limit(Resource::Cpu, limits.cpu_secs, 1);
        return Ok(());
    };
    watch(runtime, agent)
}

/// The guard's life: it keeps no descriptor of the agent's, waits for the
/// agent (and reaps what reparents to it), and ends everything when the
/// runtime dies or asks.
fn watch(runtime: u32, agent: Pid) -> ! {
    // Keep no copy of the agent's pipes, nor of the pipe the spawning side
    // reads until exec has happened: the runtime must see each of them
    // close when the agent closes it.
    // SAFETY: closes descriptors this single-threaded process owns and no
    // Rust value holds: `split` runs before exec, where no `OwnedFd` of the
    // spawning side is live in this process.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, 0 as libc::c_uint) != 0 {
            for fd in 3..65_536 {
                libc::close(fd);
            }
        }
    }
    if let Ok(null) = rustix::fs::open(c"/dev/null", rustix::fs::OFlags::RDWR, rustix::fs::Mode::empty()) {
        let _ = rustix::stdio::dup2_stdin(&null);
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    }
    // SIGTERM and SIGINT reach the whole group when the runtime stops the
    // agent: the agent handles them; the guard waits for it to exit.
    // SAFETY: the set is a local, zeroed then initialised by `sigemptyset`;
    // `sigprocmask` reads it and changes only this thread's mask.
    let waited = unsafe {
        let mut waited: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut waited);
        for sig in [Signal::CHILD, RUNTIME_DIED, Signal::TERM, Signal::INT, Signal::HUP] {
            libc::sigaddset(&mut waited, sig.as_raw());
        }
        libc::sigprocmask(libc::SIG_BLOCK, &waited, std::ptr::null_mut());
        waited
    };
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    if rustix::process::set_parent_process_death_signal(Some(RUNTIME_DIED)).is_err()
        || rustix::process::getppid().map(Pid::as_raw_nonzero).map(|p| p.get() as u32) != Some(runtime)
    {
        end_group();
    }
    loop {
        // Reap everything that has exited (orphans reparent to the guard).
        while let Ok(Some((pid, status))) = rustix::process::waitpid(None, WaitOptions::NOHANG) {
            if pid == agent {
                leave_as(status);
            }
        }
        // SAFETY: `waited` is an initialised set on this stack frame; the
        // information pointer may be null.
        if unsafe { libc::sigwaitinfo(&waited, std::ptr::null_mut()) } == RUNTIME_DIED.as_raw() {
            end_group();
        }
    }
}

/// The runtime is gone, or asks for everything to end: the agent's
/// whole process group goes, and every other descendant.
fn end_group() -> ! {
    end_descendants();
    // Whatever joined the group without being a descendant, and the guard.
    let _ = rustix::process::kill_current_process_group(Signal::KILL);
    exit_now(137)
}

/// Longest the guard spends ending descendants, in rounds of 1 ms.
const END_ROUNDS: u32 = 1_000;

/// Kills every descendant of the guard, whatever process group or
/// session it moved to (`setpgid`, `setsid`): each is the guard's child,
/// or becomes one when its parent dies, since the guard is their
/// subreaper. So killing the children in rounds, and reaping them,
/// reaches them all. Async-signal-safe: it reads `/proc` into a buffer
/// on the stack and allocates nothing.
fn end_descendants() {
    for _ in 0..END_ROUNDS {
        let Ok(fd) = rustix::fs::open(
            CHILDREN,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) else {
            return;
        };
        let (mut any, mut current, mut digits) = (false, 0i32, false);
        let mut buf = [0u8; 1024];
        while let Ok(n @ 1..) = rustix::io::read(&fd, &mut buf) {
            for &b in &buf[..n] {
                if b.is_ascii_digit() {
                    current = current.saturating_mul(10).saturating_add(i32::from(b - b'0'));
                    digits = true;
                } else if digits {
                    kill_child(current);
                    (any, current, digits) = (true, 0, false);
                }
            }
        }
        if digits {
            kill_child(current);
            any = true;
        }
        drop(fd);
        while let Ok(Some(_)) = rustix::process::waitpid(None, WaitOptions::NOHANG) {}
        if !any {
            return;
        }
        let _ = rustix::thread::nanosleep(&rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        });
    }
}

/// Kills a child of the guard, and its group too when it leads one:
/// members whose parent is still alive are not children yet.
fn kill_child(pid: i32) {
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
        let _ = rustix::process::kill_process(pid, Signal::KILL);
    }
}

/// Lowers a resource limit to `value` (the hard one to `value + hard_extra`),
/// never above what it already is. Async-signal-safe.
fn lower_limit(resource: Resource, value: Option<u64>, hard_extra: u64) {
    let Some(value) = value else { return };
    let now = rustix::process::getrlimit(resource);
    // `None` is no limit.
    let hard = value.saturating_add(hard_extra).min(now.maximum.unwrap_or(u64::MAX));
    let _ = rustix::process::setrlimit(
        resource,
        Rlimit {
            current: Some(value.min(hard)),
            maximum: Some(hard),
        },
    );
}

/// Exits the way the agent did: with its code, or by its signal. What
/// the agent left running goes first.
fn leave_as(status: WaitStatus) -> ! {
    end_descendants();
    if let Some(sig) = status.terminating_signal() {
        // SAFETY: resets one signal's disposition, unblocks it in a local
        // set initialised by `sigemptyset`, and sends it to this process.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut only: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut only);
            libc::sigaddset(&mut only, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
        }
        exit_now(128 + sig);
    }
    exit_now(status.exit_status().unwrap_or(1))
}

/// `_exit`: leaves at once, running no destructor nor `atexit` handler of
/// the runtime this process was forked from.
fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` is async-signal-safe and takes no pointer.
    unsafe { libc::_exit(code) }
}
