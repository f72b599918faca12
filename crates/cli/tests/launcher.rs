//! `polyrail_cli::launch::launch` with the `pmi_probe` example of polyrail-pmi, and with shell
//! one-liners for exit codes, environment, binding and cleanup.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use polyrail_cli::launch::{launch, Bind, LaunchOptions};

/// Builds (if needed) and locates `target/<profile>/examples/pmi_probe`.
fn probe() -> &'static Path {
    static PROBE: OnceLock<PathBuf> = OnceLock::new();
    PROBE.get_or_init(|| {
        let exe = std::env::current_exe().expect("path of the test executable");
        // target/<profile>/deps/launcher-<hash>
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile> directory").to_path_buf();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "polyrail-pmi", "--example", "pmi_probe"]);
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some("release") => {
                cmd.arg("--release");
            }
            Some(other) => {
                cmd.args(["--profile", other]);
            }
        }
        let status = cmd.current_dir(env!("CARGO_MANIFEST_DIR")).status().expect("running cargo build");
        assert!(status.success(), "cargo build of the pmi_probe example failed");
        let path = profile_dir.join("examples").join("pmi_probe");
        assert!(path.exists(), "{} was not built", path.display());
        path
    })
}

fn opts(ranks: u32, program: impl Into<OsString>, args: &[&str]) -> LaunchOptions {
    let mut o = LaunchOptions::new(ranks, program);
    o.args = args.iter().map(OsString::from).collect();
    o
}

fn probe_opts(ranks: u32, pmi: &str, args: &[&str]) -> LaunchOptions {
    let mut o = opts(ranks, probe(), args);
    o.env.push(("POLYRAIL_PMI".into(), pmi.into()));
    o
}

fn sh(ranks: u32, script: &str) -> LaunchOptions {
    opts(ranks, "sh", &["-c", script])
}

/// Runs the job; returns its code and how long it took.
fn run(o: &LaunchOptions) -> (i32, Duration) {
    let t = Instant::now();
    let code = launch(o).expect("launch");
    (code, t.elapsed())
}

#[test]
fn probe_succeeds_with_pmi1_and_pmi2() {
    for pmi in ["1", "2"] {
        for ranks in [1, 2, 4, 8] {
            let (code, _) = run(&probe_opts(ranks, pmi, &[]));
            assert_eq!(code, 0, "PMI-{pmi}, {ranks} ranks");
        }
    }
}

#[test]
fn a_rank_exiting_without_finalize_stops_the_job_fast() {
    for pmi in ["1", "2"] {
        let (code, took) = run(&probe_opts(4, pmi, &["die"]));
        // Rank 1 exits 3; the others fail their fence and exit 1: the worst is 3.
        assert_eq!(code, 3, "PMI-{pmi}");
        assert!(took < Duration::from_secs(5), "PMI-{pmi}: took {took:?}");
    }
}

#[test]
fn a_killed_rank_gives_128_plus_the_signal() {
    for pmi in ["1", "2"] {
        let (code, took) = run(&probe_opts(4, pmi, &["kill"]));
        assert_eq!(code, 128 + 9, "PMI-{pmi}");
        assert!(took < Duration::from_secs(5), "PMI-{pmi}: took {took:?}");
    }
}

#[test]
fn an_abort_gives_the_abort_code() {
    for pmi in ["1", "2"] {
        let (code, took) = run(&probe_opts(3, pmi, &["abort"]));
        assert_eq!(code, 4, "PMI-{pmi}");
        assert!(took < Duration::from_secs(5), "PMI-{pmi}: took {took:?}");
    }
}

/// A rank of an embedded job (`spawn_peers`) that aborts has the others killed, as under
/// `polyrail run`: `wait` gives the abort's code at once instead of waiting for a rank that
/// does not end by itself.
#[test]
fn an_embedded_job_ends_when_a_rank_aborts() {
    let script = format!(r#"if [ "$PMI_RANK" = 1 ]; then exec "{}" abort; else exec sleep 60; fi"#, probe().display());
    let mut o = sh(3, &script);
    o.env.push(("POLYRAIL_PMI".into(), "1".into()));
    let mut job = polyrail_cli::launch::spawn_peers(&o).expect("spawn");
    let _rank0 = job.take_bootstrap();
    let t = Instant::now();
    assert_eq!(job.wait().expect("wait"), 4);
    assert!(t.elapsed() < Duration::from_secs(20), "took {:?}", t.elapsed());
}

#[test]
fn exit_codes_propagate() {
    // Programs that never open a PMI session: exit 0 is a success.
    assert_eq!(run(&sh(3, "exit 0")).0, 0);
    assert_eq!(run(&sh(4, "exit $PMI_RANK")).0, 3);
    assert_eq!(run(&sh(2, "exit 7")).0, 7);
    assert_eq!(run(&sh(2, r#"[ "$PMI_RANK" = 1 ] && kill -SEGV $$; exit 0"#)).0, 128 + 11);
}

#[test]
fn survivors_are_killed_after_the_grace_period() {
    let mut o = sh(3, r#"[ "$PMI_RANK" = 0 ] && exit 5; exec sleep 30"#);
    o.grace = Duration::from_millis(300);
    let (code, took) = run(&o);
    // The sleepers were killed by the launcher: their SIGKILL does not hide the cause.
    assert_eq!(code, 5);
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn ranks_get_the_pmi_environment() {
    let script = r#"[ "$PMI_SIZE" = 3 ] && [ -n "$PMI_FD" ] && [ -e /proc/self/fd/$PMI_FD ] && [ -n "$PMI_JOBID" ] \
        && [ "$EXTRA" = yes ] && [ "$PMI_RANK" -lt 3 ]"#;
    let mut o = sh(3, script);
    o.env.push(("EXTRA".into(), "yes".into()));
    assert_eq!(run(&o).0, 0);
}

fn allowed_cpus(status: &str) -> String {
    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap_or("").trim().to_owned()
}

#[test]
fn binding_puts_each_rank_on_one_cpu() {
    let dir = std::env::temp_dir().join(format!("polyrail-bind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!("cat /proc/self/status > {}/status.$PMI_RANK", dir.display());
    let mine = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap());
    for bind in [Bind::Core, Bind::None] {
        let mut o = sh(2, &script);
        o.bind = bind;
        assert_eq!(run(&o).0, 0);
        let of = |r: usize| allowed_cpus(&std::fs::read_to_string(dir.join(format!("status.{r}"))).unwrap());
        let cpus = [of(0), of(1)];
        for (r, cpus) in cpus.iter().enumerate() {
            match bind {
                Bind::Core => assert!(cpus.parse::<usize>().is_ok(), "rank {r} bound to {cpus:?}"),
                Bind::None => assert_eq!(cpus, &mine, "rank {r}"),
            }
        }
        // Two CPUs or more: the ranks get different ones (round robin over the allowed CPUs).
        if bind == Bind::Core && mine.contains([',', '-']) {
            assert_ne!(cpus[0], cpus[1], "both ranks on one CPU");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The launcher removes no file: shared-memory segments are memory files of the ranks that go
/// with them, and a name in `/dev/shm` that looks like the job's may be anyone's (another user
/// may make it, and a root launcher removed another user's segment because its name matched).
#[test]
fn files_named_like_the_jobs_segments_are_left_alone() {
    let dir = std::env::temp_dir().join(format!("polyrail-shm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let script = format!(
        "touch /dev/shm/polyrail-{uid}-$PMI_JOBID-$PMI_RANK /dev/shm/polyrail-1001-$PMI_JOBID-$PMI_RANK \
         && echo $PMI_JOBID > {}/job",
        dir.display()
    );
    assert_eq!(run(&sh(2, &script)).0, 0);
    let job = std::fs::read_to_string(dir.join("job")).unwrap().trim().to_owned();
    assert!(job.starts_with(&format!("pr{}", std::process::id())), "{job}");
    let mut left = Vec::new();
    for r in 0..2 {
        for owner in [uid, 1001] {
            let file = format!("/dev/shm/polyrail-{owner}-{job}-{r}");
            left.push(Path::new(&file).exists());
            let _ = std::fs::remove_file(file);
        }
    }
    assert_eq!(left, [true; 4], "the launcher removed files it did not make");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--timeout`: a job that runs too long is stopped with SIGTERM and exits with 124; one whose
/// ranks ignore SIGTERM is killed after the grace period; a job that ends in time is untouched.
#[test]
fn a_timeout_stops_the_job() {
    let mut o = sh(2, "exec sleep 30");
    o.timeout = Some(Duration::from_millis(300));
    let (code, took) = run(&o);
    assert_eq!(code, polyrail_cli::launch::TIMEOUT_CODE);
    assert!(took < Duration::from_secs(3), "took {took:?}");

    let mut stubborn = sh(2, "trap '' TERM; while :; do sleep 0.05; done");
    stubborn.timeout = Some(Duration::from_millis(300));
    stubborn.grace = Duration::from_millis(300);
    let (code, took) = run(&stubborn);
    assert!(code >= polyrail_cli::launch::TIMEOUT_CODE, "code {code}");
    assert!(took >= Duration::from_millis(550) && took < Duration::from_secs(5), "took {took:?}");

    for limit in [Duration::from_secs(30), Duration::MAX] {
        let mut quick = sh(2, "exit 0");
        quick.timeout = Some(limit);
        assert_eq!(run(&quick).0, 0, "{limit:?}");
    }
}

/// A job needing more descriptors than the launcher may open is refused before any rank starts,
/// naming the count and the limit (it failed part-way, at whichever rank hit the limit).
#[test]
fn a_job_beyond_the_open_file_limit_is_refused_up_front() {
    // More ranks than any machine runs processes: refused as such.
    let err = launch(&opts(4_000_000_000, "true", &[])).unwrap_err().to_string();
    assert!(err.contains("at most 4194304"), "{err}");
    let ranks = polyrail_cli::launch::MAX_RANKS;
    let mut hard = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct passed.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut hard) }, 0);
    if hard.rlim_max >= 5 * libc::rlim_t::from(ranks) {
        return; // no finite limit to exceed here
    }
    let t = Instant::now();
    let err = launch(&opts(ranks, "true", &[])).unwrap_err().to_string();
    assert!(err.contains("4194304 ranks need about 20971536 open files"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(1), "took {:?}", t.elapsed());
}

#[test]
fn a_missing_program_is_an_error() {
    let err = launch(&opts(2, "/nonexistent/polyrail-no-such-program", &[])).unwrap_err();
    assert!(err.to_string().contains("rank 0"), "{err}");
    assert!(launch(&opts(0, "true", &[])).is_err());
}

/// Runs inside a child test process (see `sigterm_stops_the_job`): launches two sleepers.
#[test]
#[ignore = "helper run by sigterm_stops_the_job in a separate process"]
fn helper_launch_sleepers() {
    if std::env::var_os("PRTEST_HELPER").is_none() {
        return;
    }
    let mut o = sh(2, "exec sleep 30");
    o.grace = Duration::from_millis(500);
    let code = launch(&o).expect("launch");
    println!("job exit code {code}");
}

#[test]
fn sigterm_stops_the_job() {
    let exe = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args(["--exact", "helper_launch_sleepers", "--ignored", "--nocapture", "--test-threads=1"])
        .env("PRTEST_HELPER", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let t = Instant::now();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("job exit code 143"), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("received SIGTERM"), "{stderr}");
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
}

/// A launcher whose ranks run without PMI traffic sleeps until something happens: its main
/// thread does not wake up on a timer (it did, 100 times a second, taking a moment of a rank's
/// core each time).
#[test]
fn an_idle_launcher_does_not_wake_up() {
    let mut child =
        Command::new(env!("CARGO_BIN_EXE_polyrail")).args(["run", "-n", "2", "--", "sleep", "3"]).spawn().unwrap();
    let status = format!("/proc/{0}/task/{0}/status", child.id());
    let sleeps = || -> u64 {
        let text = std::fs::read_to_string(&status).unwrap();
        let line = text.lines().find(|l| l.starts_with("voluntary_ctxt_switches:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    std::thread::sleep(Duration::from_millis(800));
    let before = sleeps();
    std::thread::sleep(Duration::from_secs(1));
    let woke = sleeps() - before;
    assert!(child.wait().unwrap().success());
    assert!(woke <= 5, "the idle launcher's main thread went to sleep {woke} times in a second");
}

/// Runs `polyrail run` with `args` and gives back its stdout (checking that it succeeded).
fn polyrail_run_output(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_polyrail")).arg("run").args(args).output().expect("polyrail run");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Four ranks writing at once, each line in three writes (dash's `printf` writes at once):
/// every line leaves the launcher whole; with `--label` it starts with the rank that wrote it.
#[test]
fn lines_of_ranks_writing_at_once_do_not_mix() {
    let script = r#"i=0; while [ $i -lt 400 ]; do printf 'rank %s ' $PMI_RANK; printf 'line %s' $i; printf '\n'; i=$((i+1)); done"#;
    let plain = polyrail_run_output(&["-n", "4", "--bind", "none", "sh", "-c", script]);
    let labelled = polyrail_run_output(&["-n", "4", "--bind", "none", "--label", "sh", "-c", script]);
    for (output, label) in [(plain, false), (labelled, true)] {
        let mut next = [0u32; 4];
        for line in output.lines() {
            let (tag, text) = if label { line.split_once("] ").expect(line) } else { ("", line) };
            let words: Vec<&str> = text.split(' ').collect();
            assert!(words.len() == 4 && words[0] == "rank" && words[2] == "line", "mixed line: {line:?}");
            let rank: usize = words[1].parse().expect(line);
            if label {
                assert_eq!(tag, format!("[{rank}"), "{line:?}");
            }
            assert_eq!(words[3], next[rank].to_string(), "{line:?}");
            next[rank] += 1;
        }
        assert_eq!(next, [400; 4], "lines per rank");
    }
}

/// The end of a line that never comes, and a prompt awaiting input, still go out: at the end
/// of the stream, and after a short wait.
#[test]
fn unfinished_lines_are_forwarded() {
    let out = polyrail_run_output(&["-n", "1", "sh", "-c", "printf 'no end'"]);
    assert_eq!(out, "no end");
    let t = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_polyrail"))
        .args(["run", "-n", "1", "sh", "-c", "printf 'name? '; read x; echo hello $x"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut prompt = [0u8; 6];
    std::io::Read::read_exact(&mut stdout, &mut prompt).unwrap();
    assert_eq!(&prompt, b"name? ");
    assert!(t.elapsed() < Duration::from_secs(2), "the prompt took {:?}", t.elapsed());
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"rank\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(rest, "hello rank\n");
    assert!(child.wait().unwrap().success());
}

/// A hundred ranks under a soft limit of 256 open files (the launcher holds five per rank): the
/// launcher raises its own limit, and the ranks still get 256.
#[test]
fn many_ranks_under_a_low_open_file_limit() {
    let script =
        format!("ulimit -Sn 256 && exec {} run -n 100 --bind none sh -c 'ulimit -Sn'", env!("CARGO_BIN_EXE_polyrail"));
    let out = Command::new("sh").args(["-c", &script]).output().expect("sh");
    assert!(out.status.success(), "{out:?}");
    let limits = String::from_utf8_lossy(&out.stdout);
    assert_eq!(limits.lines().filter(|l| *l == "256").count(), 100, "{limits}");
}

/// A `POLYRAIL_*` value that is not text is an error naming the variable, not the default as if
/// it were unset.
#[test]
fn a_value_that_is_not_text_is_refused() {
    use std::os::unix::ffi::OsStrExt;
    let out = Command::new(env!("CARGO_BIN_EXE_polyrail"))
        .arg("info")
        .env("POLYRAIL_EAGER_LIMIT", std::ffi::OsStr::from_bytes(b"\xff"))
        .output()
        .expect("polyrail info");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("POLYRAIL_EAGER_LIMIT") && err.contains("UTF-8"), "{err}");
}

/// POLYRAIL_PMI_TIMEOUT: a rank waiting in a fence for one that stalls fails after the timeout,
/// naming it, and the launcher then stops the job (without it, the fence waits for the
/// stalled rank, as long as the launcher lets it live).
#[test]
fn a_pmi_timeout_ends_a_fence_that_waits_for_a_stalled_rank() {
    let probe = probe();
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_polyrail"))
        .args(["run", "-n", "2", "--bind", "none", "--grace", "0.2"])
        .arg(probe)
        .arg("stall")
        .env("POLYRAIL_PMI_TIMEOUT", "2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("pmi_probe rank 0 of 2") && stderr.contains("POLYRAIL_PMI_TIMEOUT"), "{stderr}");
    // Rank 1 stalls for 5 s: the job ends with rank 0's timeout, well before.
    assert!(t.elapsed() < Duration::from_millis(4500), "took {:?}: {stderr}", t.elapsed());
}

/// The state letter of process `pid` (`R`, `S`, `T` stopped, `Z`...), if it exists.
fn process_state(pid: u32) -> Option<char> {
    stat_fields(&format!("/proc/{pid}/stat"))?.first()?.chars().next()
}

/// The fields of a `/proc` stat file after the command in parentheses (which may hold anything):
/// state, ppid, pgrp... (field 3 of stat is the first).
fn stat_fields(path: &str) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(path).ok()?;
    Some(stat.rsplit_once(')')?.1.split_whitespace().map(str::to_owned).collect())
}

/// Whether `done()` holds within `limit`, asked every 10 ms.
fn holds_within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    loop {
        if done() {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pids of the children of process `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    std::fs::read_to_string(path).unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// Waits up to 5 s for every one of `pids` to be stopped (state `T`), or none.
fn wait_for_states(pids: &[u32], stopped: bool) -> bool {
    holds_within(Duration::from_secs(5), || pids.iter().all(|&p| (process_state(p) == Some('T')) == stopped))
}

/// Ctrl-Z (SIGTSTP to the launcher) stops the ranks, which sit in process groups of their own
/// where the terminal's signal does not reach them, and then the launcher; SIGCONT continues
/// the launcher and it the ranks; the job then ends as usual (here, by its timeout, which
/// the time stopped does not count against).
#[test]
fn ctrl_z_stops_and_continues_the_ranks() {
    // A process group of its own, whose parent (this test) is in another group of the same
    // session, as a shell's job is: the kernel discards SIGTSTP in an orphaned group (as this
    // test's own may be, under CI), and the launcher would then rightly not stop.
    let mut child = Command::new(env!("CARGO_BIN_EXE_polyrail"))
        .args(["run", "-n", "2", "--bind", "none", "--timeout", "3", "--", "sleep", "30"])
        .process_group(0)
        .spawn()
        .unwrap();
    let launcher = child.id();
    let mut ranks = Vec::new();
    holds_within(Duration::from_secs(5), || {
        ranks = children_of(launcher);
        ranks.len() == 2
    });
    assert_eq!(ranks.len(), 2, "ranks of the launcher: {ranks:?}");
    // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
    unsafe { libc::kill(launcher as libc::pid_t, libc::SIGTSTP) };
    assert!(wait_for_states(&ranks, true) && wait_for_states(&[launcher], true), "not all stopped");
    let stopped_at = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: as above.
    unsafe { libc::kill(launcher as libc::pid_t, libc::SIGCONT) };
    assert!(wait_for_states(&ranks, false) && wait_for_states(&[launcher], false), "not all continued");
    let status = wait_at_most(&mut child, Duration::from_secs(15));
    assert_eq!(status.code(), Some(polyrail_cli::launch::TIMEOUT_CODE));
    assert!(stopped_at.elapsed() > Duration::from_secs(4), "the time stopped counted against the timeout");
}

/// Waits up to `limit` for `child` to exit; kills it (and fails) if it does not.
fn wait_at_most(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("polyrail run still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// CPU time (clock ticks) the main thread of process `pid` has used.
fn main_thread_ticks(pid: u32) -> u64 {
    let fields = stat_fields(&format!("/proc/{pid}/task/{pid}/stat")).expect("the launcher's main thread");
    // utime and stime: fields 14 and 15 of stat, 12 and 13 after the command.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// A launcher whose stdout nobody reads (a full pipe) still stops its job at the timeout and
/// exits: it wrote the ranks' output from its main loop, blocked in that write, and then
/// neither the timeout nor a signal acted. Meanwhile it sleeps: a backed-up unfinished line
/// (one rank writes no line ends) made its poll spin.
#[test]
fn a_reader_that_does_not_read_does_not_stop_the_timeout() {
    let (reader, writer) = std::io::pipe().unwrap();
    let t = Instant::now();
    let script = "if [ $PMI_RANK = 0 ]; then yes; else while :; do printf xxxxxxxxxxxxxxxx; done; fi";
    let mut child = Command::new(env!("CARGO_BIN_EXE_polyrail"))
        .args(["run", "-n", "2", "--bind", "none", "--timeout", "2", "--", "sh", "-c", script])
        .stdout(writer)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let before = main_thread_ticks(child.id());
    std::thread::sleep(Duration::from_secs(1));
    let used = main_thread_ticks(child.id()) - before;
    let status = wait_at_most(&mut child, Duration::from_secs(15));
    assert_eq!(status.code(), Some(polyrail_cli::launch::TIMEOUT_CODE));
    assert!(t.elapsed() < Duration::from_secs(6), "took {:?}", t.elapsed());
    assert!(used < 30, "the launcher's main thread used {used} ticks of a second while its output was backed up");
    drop(reader);
}

/// Whether process `pid` has ended (gone, or a zombie its new parent has not reaped yet).
fn has_ended(pid: u32) -> bool {
    process_state(pid).is_none_or(|s| matches!(s, 'Z' | 'X'))
}

/// Processes a rank starts (a rank that is a shell running a program) end with the job: when
/// the job is stopped (they get its SIGTERM, also those of a rank that exited before) and when
/// the ranks exit leaving them behind (they are killed, and the launcher says so). Before,
/// both kinds ran on after the job.
#[test]
fn processes_the_ranks_start_end_with_the_job() {
    let jobs: [(&[&str], &str); 3] = [
        (&["--timeout", "1", "sh", "-c", "sleep 300 & echo $!; wait"], ""),
        (&["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], "killed what the ranks left running"),
        // Rank 0 exits at once: what it left gets the timeout's SIGTERM all the same.
        (&["--timeout", "1", "sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!; [ $PMI_RANK = 0 ] || sleep 30"], ""),
    ];
    for (args, said) in jobs {
        let mut child = Command::new(env!("CARGO_BIN_EXE_polyrail"))
            .args(["run", "-n", "2", "--bind", "none"])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_at_most(&mut child, Duration::from_secs(15));
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let pids: Vec<u32> = stdout.lines().map(|l| l.parse().expect(l)).collect();
        assert_eq!(pids.len(), 2, "{stdout}");
        holds_within(Duration::from_secs(2), || pids.iter().all(|&p| has_ended(p)));
        for p in pids {
            assert!(has_ended(p), "process {p} of {args:?} outlived the job; stderr: {stderr}");
            if said.is_empty() {
                // The job's SIGTERM reached them: nothing was left to kill at the end.
                assert!(!stderr.contains("killed what the ranks left running"), "{stderr}");
            } else {
                assert!(stderr.contains(said) && stderr.contains(&format!("{p} (from rank ")), "{stderr}");
            }
        }
    }
}

/// A launcher killed with SIGKILL (which it cannot catch to stop its job) leaves no rank
/// running: each rank asked the kernel to kill it when the launcher dies.
#[test]
fn ranks_die_with_a_killed_launcher() {
    // The ranks are `sleep 30.PID`: a command line no other process has.
    let seconds = format!("30.{}", std::process::id());
    let marker = format!("sleep\0{seconds}\0");
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_polyrail"))
        .args(["run", "-n", "2", "--bind", "none", "--", "sleep", &seconds])
        .spawn()
        .unwrap();
    let ranks = || -> Vec<u32> {
        let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == marker.as_bytes()))
            .collect()
    };
    let t = Instant::now();
    while ranks().len() < 2 {
        assert!(t.elapsed() < Duration::from_secs(10), "the ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    launcher.kill().unwrap(); // SIGKILL
    launcher.wait().unwrap();
    let t = Instant::now();
    while !ranks().is_empty() {
        if t.elapsed() > Duration::from_secs(2) {
            for pid in ranks() {
                // SAFETY: kill has no memory-safety preconditions; the pid ran our marker.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            panic!("ranks outlived the killed launcher");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// With `--label`, an unfinished line written out after its wait, then another rank's line,
/// then the rest of the first: three labelled lines (the continuation was unlabelled, after
/// the other rank's text on the same line). The ranks take turns through marker files, each
/// step well after the launcher's 50 ms wait for an unfinished line.
#[test]
fn labelled_lines_never_mix_across_a_partial_write() {
    let dir = std::env::temp_dir().join(format!("polyrail-label-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = r#"cd "$1"
if [ "$PMI_RANK" = 0 ]; then
    printf 'progress: '; sleep 0.3; touch a
    while [ ! -e b ]; do sleep 0.05; done; sleep 0.3; echo done
else
    while [ ! -e a ]; do sleep 0.05; done; echo 'rank one line'; sleep 0.3; touch b
fi"#;
    let d = dir.to_str().unwrap();
    let out = polyrail_run_output(&["-n", "2", "--bind", "none", "--label", "sh", "-c", script, "sh", d]);
    let _ = std::fs::remove_dir_all(&dir);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["[0] progress: ", "[1] rank one line", "[0] done"], "{out:?}");
}
