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

use libc::{c_int, pid_t};

/// Signal the guard gets when the runtime dies, or when the runtime
/// stops an agent that does not stop by itself.
pub const RUNTIME_DIED: c_int = libc::SIGUSR1;
/// `CAP_SYS_PTRACE`, `CAP_SYS_ADMIN` and `CAP_PERFMON`
/// (linux/capability.h).
const MEMORY_READING_CAPABILITIES: [libc::c_ulong; 3] = [19, 21, 38];

/// Takes `caps` out of this process's inheritable set (`capget` and
/// `capset`, version 3). Async-signal-safe.
unsafe fn clear_inheritable(caps: &[libc::c_ulong]) {
    // SAFETY: both syscalls read and write only `header` and `data`, which
    // live on this stack frame and have the layout the kernel expects
    // (version 3: two `Data`).
    unsafe {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: c_int,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let mut header = Header {
            version: 0x2008_0522,
            pid: 0,
        };
        let mut data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capget, &mut header as *mut Header, data.as_mut_ptr()) != 0 {
            return;
        }
        for &cap in caps {
            data[(cap / 32) as usize].inheritable &= !(1u32 << (cap % 32));
        }
        libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr());
    }
}

/// The calling thread's children, as the kernel lists them
/// (`CONFIG_PROC_CHILDREN`). The guard is single-threaded, so for it
/// these are the process's children.
const CHILDREN: &std::ffi::CStr = c"/proc/thread-self/children";

/// Says once, on stderr, when the kernel cannot list a process's
/// children ([`CHILDREN`]): the guard then cannot find what left the
/// agent's process group.
pub fn check_support() {
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        if !std::path::Path::new(CHILDREN.to_str().expect("the path is ASCII")).exists() {
            eprintln!(
                "attest-ecp: this kernel does not list a process's children (/proc/<pid>/task/<tid>/children): processes an agent starts outside its process group may outlive it"
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
    // SAFETY: prctl with these arguments only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0);
    }
}

/// Runs in the spawned process before exec: returns in the agent (which
/// then execs the target), never returns in the guard.
///
/// # Safety
///
/// Call only between `fork` and `exec` (a `pre_exec` hook), where only
/// async-signal-safe functions may run: `runtime` is the pid of the
/// process that spawned this one.
pub unsafe fn split(runtime: pid_t, limits: super::AgentLimits) -> std::io::Result<()> {
    // SAFETY: the caller's contract (# Safety above): only async-signal-safe
    // calls follow, which allocate nothing and take no lock.
    unsafe {
        let guard = libc::getpid();
        let agent = libc::fork();
        if agent < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if agent == 0 {
            // The agent dies with its guard.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 || libc::getppid() != guard {
                libc::_exit(1);
            }
            // An agent run as root would otherwise read the runtime's and the
            // guard's memory despite `hide_memory`: each of these
            // capabilities opens a process that is not dumpable. Out of its
            // bounding set, the agent cannot get them back when it execs.
            // Refused (and harmless) for an agent that is not root.
            for cap in MEMORY_READING_CAPABILITIES {
                libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
            }
            // An exec as root also grants what the ambient and inheritable
            // sets hold.
            libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0);
            clear_inheritable(&MEMORY_READING_CAPABILITIES);
            // No core dump either: a crashing agent would write its whole memory.
            lower_limit(libc::RLIMIT_CORE, Some(0), 0);
            lower_limit(libc::RLIMIT_DATA, limits.memory_bytes, 0);
            // The hard limit a second later: SIGXCPU first, which an agent may report.
            lower_limit(libc::RLIMIT_CPU, limits.cpu_secs, 1);
            return Ok(());
        }
        watch(runtime, agent)
    }
}

unsafe fn watch(runtime: pid_t, agent: pid_t) -> ! {
    // SAFETY: runs in the guard, single-threaded after `fork`; every call is
    // a raw syscall on descriptors, signal sets and status words it owns.
    unsafe {
        // Keep no copy of the agent's pipes, nor of the pipe the spawning
        // side reads until exec has happened: the runtime must see each of
        // them close when the agent closes it.
        if libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, 0 as libc::c_uint) != 0 {
            for fd in 3..65_536 {
                libc::close(fd);
            }
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
        let mut waited: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut waited);
        // SIGTERM and SIGINT reach the whole group when the runtime stops the
        // agent: the agent handles them; the guard waits for it to exit.
        for sig in [libc::SIGCHLD, RUNTIME_DIED, libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut waited, sig);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &waited, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        if libc::prctl(libc::PR_SET_PDEATHSIG, RUNTIME_DIED as libc::c_ulong, 0, 0, 0) != 0 || libc::getppid() != runtime {
            end_group();
        }
        loop {
            // Reap everything that has exited (orphans reparent to the guard).
            loop {
                let mut status: c_int = 0;
                let pid = libc::waitpid(-1, &mut status, libc::WNOHANG);
                if pid <= 0 {
                    break;
                }
                if pid == agent {
                    leave_as(status);
                }
            }
            if libc::sigwaitinfo(&waited, std::ptr::null_mut()) == RUNTIME_DIED {
                end_group();
            }
        }
    }
}

/// The runtime is gone, or asks for everything to end: the agent's
/// whole process group goes, and every other descendant.
unsafe fn end_group() -> ! {
    // SAFETY: signals and exits only; called in the single-threaded guard.
    unsafe {
        end_descendants();
        // Whatever joined the group without being a descendant, and the guard.
        libc::kill(0, libc::SIGKILL);
        libc::_exit(137)
    }
}

/// Longest the guard spends ending descendants, in rounds of 1 ms.
const END_ROUNDS: u32 = 1_000;

/// Kills every descendant of the guard, whatever process group or
/// session it moved to (`setpgid`, `setsid`): each is the guard's child,
/// or becomes one when its parent dies, since the guard is their
/// subreaper. So killing the children in rounds, and reaping them,
/// reaches them all. Async-signal-safe: it reads `/proc` into a buffer
/// on the stack and allocates nothing.
unsafe fn end_descendants() {
    // SAFETY: reads `/proc` into a buffer on this stack frame, and kills and
    // reaps children of the single-threaded guard: async-signal-safe.
    unsafe {
        for _ in 0..END_ROUNDS {
            let fd = libc::open(CHILDREN.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return;
            }
            let (mut any, mut current, mut digits) = (false, 0 as pid_t, false);
            let mut buf = [0u8; 1024];
            loop {
                let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    break;
                }
                for &b in &buf[..n as usize] {
                    if b.is_ascii_digit() {
                        current = current.saturating_mul(10).saturating_add((b - b'0') as pid_t);
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
            libc::close(fd);
            let mut status: c_int = 0;
            while libc::waitpid(-1, &mut status, libc::WNOHANG) > 0 {}
            if !any {
                return;
            }
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 1_000_000,
            };
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
    }
}

/// Kills a child of the guard, and its group too when it leads one:
/// members whose parent is still alive are not children yet.
unsafe fn kill_child(pid: pid_t) {
    // SAFETY: `kill` takes no pointers; a pid that is gone is refused.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Lowers a resource limit to `value` (the hard one to `value + hard_extra`),
/// never above what it already is. Async-signal-safe.
unsafe fn lower_limit(resource: libc::__rlimit_resource_t, value: Option<u64>, hard_extra: u64) {
    // SAFETY: `getrlimit` and `setrlimit` read and write a local `rlimit`.
    unsafe {
        let Some(value) = value else { return };
        let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(resource, &mut now) != 0 {
            return;
        }
        let hard = (value.saturating_add(hard_extra) as libc::rlim_t).min(now.rlim_max);
        let soft = (value as libc::rlim_t).min(hard);
        libc::setrlimit(
            resource,
            &libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            },
        );
    }
}

/// Exits the way the agent did: with its code, or by its signal. What
/// the agent left running goes first.
unsafe fn leave_as(status: c_int) -> ! {
    // SAFETY: signals and exits the single-threaded guard; the signal set
    // is a local, zeroed then initialised by `sigemptyset`.
    unsafe {
        end_descendants();
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            let mut only: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut only);
            libc::sigaddset(&mut only, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}
