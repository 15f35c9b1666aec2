//! The fuzzer's command-line half: every count, size and float flag of every command given
//! zero, negative, huge, `u64::MAX`, past-`u64` and non-numeric values, and every file the
//! commands read (scenario, model, hardware profile, GEMM table, `--from` table, gate lock)
//! replaced by a special file: `/dev/zero`, `/dev/urandom`, `/dev/null`, a FIFO, a
//! directory, a symlink to each, a dangling and a looping symlink, a sparse 8 GiB file,
//! binary garbage, an empty file. Each case runs the built binary under the scenario
//! fuzzer's memory limit and timeout and must end in exit 0, 1 or 2 with a message (never a
//! panic, abort, signal or hang); a special file where a file is read must end in exit 2.

use super::{Outcome, run_command};
use std::path::{Path, PathBuf};

/// One command line and whether it certainly is bad input (exit 2 expected).
pub struct InputCase {
    /// Arguments after `hpfsdp`.
    pub args: Vec<String>,
    /// The input certainly is invalid: exit 0 or 1 is a failure.
    pub invalid: bool,
}

/// Integer values every count flag is given: (value, certainly invalid whatever the flag).
const INT_VALUES: &[(&str, bool)] = &[
    ("0", false),
    ("-1", true),
    ("-9223372036854775808", true),
    ("1000000000", false),
    ("4000000000", false),
    ("18446744073709551615", false),
    ("18446744073709551616", true),
    ("1e9", true),
    ("0x10", true),
    ("abc", true),
    ("", true),
];

/// Values every float flag (seconds, percent) is given.
const FLOAT_VALUES: &[(&str, bool)] = &[
    ("0", false),
    ("-1", false),
    ("nan", false),
    ("inf", false),
    ("-inf", false),
    ("1e300", false),
    ("1e-300", false),
    ("abc", true),
    ("", true),
];

/// Makes the special files in `dir`: (label, path). Every one is something no command may
/// read as its input.
pub fn special_files(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    std::fs::create_dir_all(dir.join("a-directory.toml")).unwrap();
    let fifo = dir.join("fifo.toml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo {}", fifo.display());
    let huge = dir.join("huge.toml");
    // Sparse: 8 GiB of holes costs no disk.
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(8 << 30)
        .unwrap();
    let garbage: Vec<u8> = (0..65536u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("garbage.toml"), garbage).unwrap();
    std::fs::write(dir.join("empty.toml"), "").unwrap();
    let link = |name: &str, target: &Path| {
        let path = dir.join(name);
        std::os::unix::fs::symlink(target, &path).unwrap();
        path
    };
    vec![
        ("/dev/zero", PathBuf::from("/dev/zero")),
        ("/dev/urandom", PathBuf::from("/dev/urandom")),
        ("/dev/null", PathBuf::from("/dev/null")),
        ("a FIFO", fifo.clone()),
        ("a directory", dir.join("a-directory.toml")),
        ("a missing file", dir.join("absent.toml")),
        (
            "a symlink to /dev/zero",
            link("zero.toml", Path::new("/dev/zero")),
        ),
        (
            "a symlink to /dev/urandom",
            link("urandom.toml", Path::new("/dev/urandom")),
        ),
        ("a symlink to a FIFO", link("fifo-link.toml", &fifo)),
        (
            "a dangling symlink",
            link("dangling.toml", &dir.join("nothing")),
        ),
        ("a symlink loop", link("loop.toml", &dir.join("loop.toml"))),
        ("a sparse 8 GiB file", huge),
        ("binary garbage", dir.join("garbage.toml")),
        ("an empty file", dir.join("empty.toml")),
    ]
}

/// `scenarios/verify/dense-fsdp4.toml` rewritten into `dir/scen/NAME.toml` with `edit`
/// applied after its model path is made absolute (so the hardware directory beside it,
/// `dir/hardware`, is the one the commands search).
fn scenario_copy(root: &Path, dir: &Path, name: &str, edit: impl Fn(String) -> String) -> String {
    let text = std::fs::read_to_string(root.join("scenarios/verify/dense-fsdp4.toml")).unwrap();
    let model = root.join("scenarios/verify/models/tiny-dense.toml");
    let text = text.replace(
        "compact = \"models/tiny-dense.toml\"",
        &format!("compact = \"{}\"", model.display()),
    );
    let scen = dir.join("scen");
    std::fs::create_dir_all(&scen).unwrap();
    let path = scen.join(format!("{name}.toml"));
    std::fs::write(&path, edit(text)).unwrap();
    path.to_str().unwrap().to_string()
}

fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Every command that reads a scenario, with `scenario` as its input; `out` is scratch.
fn scenario_commands(scenario: &str, out: &str) -> Vec<Vec<String>> {
    vec![
        args(&["plan", scenario]),
        args(&["simulate", scenario, "--strategy", "hyperparallel"]),
        args(&["verify", scenario]),
        args(&["muon", scenario]),
        args(&["replay", scenario, "--backend", "inproc", "--out", out]),
        args(&[
            "sweep",
            scenario,
            "--vary",
            "train.seq_len=32",
            "--out",
            out,
        ]),
        args(&["export", scenario, "--chakra", out]),
        args(&["gate", scenario, "--lock", "hpfsdp.lock"]),
    ]
}

/// Cases putting each special file where a file is read.
pub fn file_cases(root: &Path, dir: &Path) -> Vec<InputCase> {
    let specials = special_files(&dir.join("special"));
    let out = dir.join("out").to_str().unwrap().to_string();
    let hw = dir.join("hardware");
    std::fs::create_dir_all(&hw).unwrap();
    let profile =
        std::fs::read_to_string(root.join("scenarios/hardware/ascend-910c-a3.toml")).unwrap();
    let mut cases = Vec::new();
    let mut bad = |a: Vec<String>| {
        cases.push(InputCase {
            args: a,
            invalid: true,
        })
    };
    for (n, (_, path)) in specials.iter().enumerate() {
        let p = path.to_str().unwrap();
        for a in scenario_commands(p, &out) {
            bad(a);
        }
        // The model path is a symlink named as each parser expects it.
        for (key, ext) in [("compact", "toml"), ("hf_config", "json")] {
            let model = dir.join(format!("model-{n}.{ext}"));
            std::os::unix::fs::symlink(path, &model).unwrap();
            let s = scenario_copy(root, dir, &format!("model-{key}-{n}"), |t| {
                let model_line = t.lines().find(|l| l.starts_with("compact")).unwrap();
                t.replace(model_line, &format!("{key} = \"{}\"", model.display()))
            });
            bad(args(&["plan", &s]));
            bad(args(&["verify", &s]));
        }
        // A hardware profile (hardware/profile-N.toml) and a GEMM table its profile names.
        std::os::unix::fs::symlink(path, hw.join(format!("profile-{n}.toml"))).unwrap();
        let s = scenario_copy(root, dir, &format!("profile-{n}"), |t| {
            t.replace(
                "hardware = \"ascend-910c-a3\"",
                &format!("hardware = \"profile-{n}\""),
            )
        });
        bad(args(&["simulate", &s, "--strategy", "hyperparallel"]));
        let with_table = profile
            .replace(
                "name = \"ascend-910c-a3\"",
                &format!("name = \"table-{n}\""),
            )
            .replace(
                "[compute]\n",
                &format!("[compute]\ngemm_table = \"t{n}.csv\"\n"),
            );
        std::fs::write(hw.join(format!("table-{n}.toml")), with_table).unwrap();
        std::os::unix::fs::symlink(path, hw.join(format!("t{n}.csv"))).unwrap();
        let s = scenario_copy(root, dir, &format!("table-{n}"), |t| {
            t.replace(
                "hardware = \"ascend-910c-a3\"",
                &format!("hardware = \"table-{n}\""),
            )
        });
        bad(args(&["simulate", &s, "--strategy", "hyperparallel"]));
        bad(args(&[
            "gate",
            "scenarios/verify/dense-fsdp4.toml",
            "--lock",
            p,
        ]));
        bad(args(&[
            "calibrate",
            "--hardware",
            "cpu-mpi",
            "--from",
            p,
            "--out",
            &out,
        ]));
        bad(args(&[
            "calibrate",
            "--hardware",
            "ascend-910c-a3",
            "--runs",
            p,
        ]));
    }
    // A gate directory holding a FIFO and a device link among its scenarios.
    let gate_dir = dir.join("special");
    bad(args(&[
        "gate",
        gate_dir.to_str().unwrap(),
        "--lock",
        &format!("{out}/l.lock"),
    ]));
    cases
}

/// `base` with `flag` set to `value` as `--flag=value` (so `-1` reaches the flag's own
/// checks rather than being taken for a flag), replacing the flag's value in `base`.
fn with_flag(base: &[&str], flag: &str, value: &str) -> Vec<String> {
    let mut a = args(base);
    if let Some(i) = a.iter().position(|x| x == flag) {
        a.drain(i..i + 2);
    }
    a.push(format!("{flag}={value}"));
    a
}

/// Every value of [`INT_VALUES`] for each `(base, flag)` of `ints`, every one of
/// [`FLOAT_VALUES`] for each of `floats`.
fn value_cases(ints: &[(&[&str], &str)], floats: &[(&[&str], &str)]) -> Vec<InputCase> {
    let mut cases = Vec::new();
    for (values, list) in [(INT_VALUES, ints), (FLOAT_VALUES, floats)] {
        for (base, flag) in list {
            for &(v, invalid) in values {
                cases.push(InputCase {
                    args: with_flag(base, flag, v),
                    invalid,
                });
            }
        }
    }
    cases
}

/// Count and float flags of `sweep`, `verify` and `gate`, and the point count of a sweep.
pub fn flag_cases(dir: &Path) -> Vec<InputCase> {
    let out = dir.join("flags-out");
    let out = out.to_str().unwrap();
    let scenario = "scenarios/verify/dense-fsdp4.toml";
    let sweep = [
        "sweep",
        scenario,
        "--vary",
        "train.seq_len=32",
        "--out",
        out,
    ];
    let verify = ["verify", scenario];
    let gate = ["gate", scenario, "--lock", "hpfsdp.lock"];
    let mut cases = value_cases(
        &[(&sweep, "--jobs")],
        &[(&verify, "--timeout-s"), (&gate, "--max-regression-pct")],
    );
    // Every value makes an invalid point, which the sweep reports (exit 0 or 1).
    for &(v, _) in INT_VALUES {
        cases.push(InputCase {
            args: with_flag(&sweep, "--vary", &format!("mesh.dp_shard={v}")),
            invalid: false,
        });
    }
    // 301 x 301 points, past the sweep's limit: refused before any point is built.
    let many: String = (1..=300).map(|i| format!("{i},")).collect::<String>() + "301";
    let mut a = args(&["sweep", scenario, "--out", out]);
    for key in ["train.seq_len", "train.global_batch"] {
        a.extend(["--vary".to_string(), format!("{key}={many}")]);
    }
    cases.push(InputCase {
        args: a,
        invalid: true,
    });
    cases
}

/// Count, size and float flags of `replay` and `collbench` (inproc backend). Among them
/// `collbench --max-bytes 1000000000`: inside its limit, but its buffers do not fit the
/// fuzzer's 4 GiB address space, so collbench must refuse it cleanly (it reserves them first).
pub fn replay_collbench_flag_cases(dir: &Path) -> Vec<InputCase> {
    let out = dir.join("flags-out");
    let out = out.to_str().unwrap();
    let csv = format!("{out}/c.csv");
    let replay = [
        "replay",
        "scenarios/verify/dense-fsdp4.toml",
        "--backend",
        "inproc",
        "--out",
        out,
        "--steps",
        "1",
    ];
    let collbench = [
        "collbench",
        "--backend",
        "inproc",
        "--kinds",
        "all-reduce",
        "--min-bytes",
        "8",
        "--max-bytes",
        "64K",
        "--iters",
        "2",
        "--warmup",
        "0",
        "--ranks",
        "2",
        "--out",
        &csv,
    ];
    let mut ints: Vec<(&[&str], &str)> = Vec::new();
    for f in ["--ranks", "--layers", "--steps", "--warmup"] {
        ints.push((&replay, f));
    }
    for f in [
        "--iters",
        "--warmup",
        "--ranks",
        "--min-bytes",
        "--max-bytes",
        "--factor",
    ] {
        ints.push((&collbench, f));
    }
    let floats: Vec<(&[&str], &str)> = vec![(&replay, "--timeout-s"), (&collbench, "--timeout-s")];
    let mut cases = value_cases(&ints, &floats);
    // No value divides the 2 ranks: every group size is bad input.
    for &(v, _) in INT_VALUES {
        cases.push(InputCase {
            args: with_flag(&collbench, "--groups", &format!("size:{v}")),
            invalid: true,
        });
    }
    cases
}

/// Runs `cases`; returns one line per failure.
pub fn run_cases(root: &Path, cases: &[InputCase]) -> Vec<String> {
    let mut failures = Vec::new();
    for case in cases {
        let refs: Vec<&str> = case.args.iter().map(String::as_str).collect();
        let (outcome, stderr, printed) = run_command(root, &refs);
        let tail: String = stderr.lines().rev().take(2).collect::<Vec<_>>().join(" | ");
        if std::env::var_os("HPFSDP_FUZZ_VERBOSE").is_some() {
            println!("hpfsdp {}\n  -> {tail}", case.args.join(" "));
        }
        let problem = match outcome {
            Outcome::Crash(why) => Some(why),
            Outcome::Exit(c) if c > 2 => Some(format!("exit {c}")),
            Outcome::Exit(c) if case.invalid && c != 2 => {
                Some(format!("exit {c} on certainly bad input"))
            }
            Outcome::Exit(c) if c != 0 && !printed => Some(format!("exit {c} without a message")),
            Outcome::Exit(_) => None,
        };
        if let Some(why) = problem {
            failures.push(format!(
                "`hpfsdp {}`: {why}; stderr: {tail}",
                case.args.join(" ")
            ));
        }
    }
    failures
}
