//! Scenario fuzzer: seeded mutations of the real scenario TOML files and the model files they
//! name (HF `config.json` and compact TOML): deleted keys, wrong types, zero / negative / huge
//! numbers, inconsistent meshes and topologies, duplicated and unknown keys, garbage bytes.
//! Every case runs `plan`, `simulate` and `verify` through the built binary under a memory
//! limit and a timeout, and fails on a panic (exit 101), a signal or abort, a timeout, or exit
//! status 0 on an input the mutation made certainly invalid.
//!
//! The normal suite runs a bounded number of cases (`HPFSDP_FUZZ_CASES`, default 150; seed
//! `HPFSDP_FUZZ_SEED`, default fixed) and prints how many ran; `fuzz_scenarios_long` (ignored)
//! runs 5,000. A failing case is kept under the temporary directory and named in the message.
//!
//! The command-line half (`tests/fuzz/inputs.rs`) gives every count and float flag zero,
//! negative, huge, `u64::MAX` and non-numeric values, and puts special files (devices, FIFOs,
//! directories, symlinks to them, a sparse 8 GiB file, garbage) wherever a command reads a
//! file; every such case must end in exit 0, 1 or 2 with a message.

#[path = "fuzz/inputs.rs"]
mod inputs;

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Scenarios the mutations start from. The 768-rank exp-d and exp-c take a minute and
/// gigabytes to simulate, so the corpus keeps their small fixture twin instead.
const CORPUS: &[&str] = &[
    "scenarios/verify/dense-fsdp4.toml",
    "scenarios/verify/dense-fsdp4-muon.toml",
    "scenarios/verify/dense-hsdp2x4.toml",
    "scenarios/verify/dense-tp2-fsdp2.toml",
    "scenarios/verify/mla-hsdp2x2-muon.toml",
    "scenarios/verify/moe-ep2-fsdp2.toml",
    "scenarios/verify/uneven-fsdp3-muon.toml",
    "scenarios/fixtures/mini-exp-d.toml",
    "scenarios/fixtures/muon-hsdp-2x8.toml",
    "scenarios/paper/exp-a-mbs1.toml",
    "scenarios/paper/exp-b.toml",
    "scenarios/paper/muon-vs-dmuon.toml",
];

/// Seconds one command may run before the case counts as a hang.
const TIMEOUT_S: u64 = 60;
/// Address-space limit of one command, KiB (`ulimit -v`): 4 GiB.
const MEMORY_LIMIT_KIB: u64 = 4 << 20;

/// Scenario keys that must be present (no default).
const REQUIRED: &[&str] = &[
    "name",
    "hardware",
    "dies_per_machine",
    "machines_per_supernode",
    "supernodes",
    "seq_len",
    "global_batch",
    "micro_batch",
];

/// Model-file dimensions that must be at least 1 whatever the model.
const MODEL_POSITIVE: &[&str] = &[
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
];

/// Model-file dimensions the fuzzer mutates.
const MODEL_DIMS: &[&str] = &[
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "first_k_dense_replace",
    "n_shared_experts",
];

/// One generated input: the scenario text, the model text, what was done and whether the
/// mutation certainly made the input invalid.
struct Case {
    scenario: String,
    model: String,
    model_ext: String,
    what: Vec<String>,
    invalid: bool,
}

/// A `key = value` (TOML) or `"key": value` (JSON) line: `(indent+key+separator, key, value, trailer)`.
fn split_pair(line: &str) -> Option<(String, String, String, String)> {
    let t = line.trim_start();
    if t.starts_with('#') || t.starts_with('[') || t.starts_with('{') || t.starts_with('}') {
        return None;
    }
    let sep = if t.starts_with('"') { ':' } else { '=' };
    let (k, v) = line.split_once(sep)?;
    let key = k.trim().trim_matches('"').to_string();
    if key.is_empty() || key.contains(' ') {
        return None;
    }
    // Keep a trailing comment or JSON comma outside the value.
    let v_trim = v.trim();
    let (value, trailer) = match v_trim.find(" #") {
        Some(i) => (v_trim[..i].trim().to_string(), v_trim[i..].to_string()),
        None => match v_trim.strip_suffix(',') {
            Some(s) => (s.trim().to_string(), ",".into()),
            None => (v_trim.to_string(), String::new()),
        },
    };
    Some((format!("{k}{sep} "), key, value, trailer))
}

fn is_int(v: &str) -> bool {
    !v.is_empty()
        && v.trim_start_matches('-')
            .chars()
            .all(|c| c.is_ascii_digit())
}

fn pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [T]) -> &'a T {
    &items[(rng.next_u64() % items.len() as u64) as usize]
}

/// Indices of the lines holding a `key = value` pair (filtered by `keep`).
fn pair_lines(text: &str, keep: impl Fn(&str, &str) -> bool) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| split_pair(l).filter(|(_, k, v, _)| keep(k, v)).map(|_| i))
        .collect()
}

fn replace_line(text: &str, index: usize, new: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines[index] = new.to_string();
    lines.join("\n") + "\n"
}

/// Integer keys of the scenario whose zero is invalid (every one but `prefetch_depth`).
fn zero_is_invalid(key: &str) -> bool {
    key != "prefetch_depth"
}

/// Applies one mutation to the scenario text; returns whether it surely made it invalid.
fn mutate_scenario(rng: &mut ChaCha8Rng, text: &mut String, what: &mut Vec<String>) -> bool {
    let ints = pair_lines(text, |_, v| is_int(v));
    let any = pair_lines(text, |_, _| true);
    match rng.next_u64() % 9 {
        0 if !ints.is_empty() => {
            let i = *pick(rng, &ints);
            let (head, key, _, tail) = split_pair(text.lines().nth(i).unwrap()).unwrap();
            let (v, invalid) = match rng.next_u64() % 6 {
                0 => ("0".to_string(), zero_is_invalid(&key)),
                1 => ("-1".to_string(), true),
                2 => (format!("{}", i64::MAX), true),
                3 => (format!("{}", 1u64 << (41 + rng.next_u64() % 22)), true),
                4 => (format!("{}", 1 + rng.next_u64() % 9), false),
                _ => (format!("{}", 1u64 << (rng.next_u64() % 40)), false),
            };
            what.push(format!("{key} = {v}"));
            *text = replace_line(text, i, &format!("{head}{v}{tail}"));
            invalid
        }
        1 if !any.is_empty() => {
            // Wrong type: a string where a number or table was, a number where a string was.
            let i = *pick(rng, &any);
            let (head, key, value, tail) = split_pair(text.lines().nth(i).unwrap()).unwrap();
            let v = if value.starts_with('"') || value == "true" || value == "false" {
                "[1, 2]".to_string()
            } else {
                "\"not a number\"".to_string()
            };
            what.push(format!("{key} = {v} (wrong type)"));
            *text = replace_line(text, i, &format!("{head}{v}{tail}"));
            true
        }
        2 if !any.is_empty() => {
            let i = *pick(rng, &any);
            let key = split_pair(text.lines().nth(i).unwrap()).unwrap().1;
            what.push(format!("delete {key}"));
            *text = text
                .lines()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, l)| format!("{l}\n"))
                .collect();
            REQUIRED.contains(&key.as_str())
        }
        3 if !any.is_empty() => {
            let i = *pick(rng, &any);
            let line = text.lines().nth(i).unwrap().to_string();
            what.push(format!("duplicate line {}", i + 1));
            let mut lines: Vec<&str> = text.lines().collect();
            lines.insert(i, &line);
            *text = lines.join("\n") + "\n";
            true
        }
        4 => {
            what.push("unknown top-level key".into());
            *text = format!("bogus_key = 1\n{text}");
            true
        }
        5 => {
            // Garbage bytes: TOML forbids control characters even in comments; a non-UTF-8
            // byte makes the file unreadable as text.
            let garbage = ['\u{0}', '\u{7}', '\u{1b}', '\u{7f}'];
            let c = *pick(rng, &garbage);
            let pos =
                floor_char_boundary(text, (rng.next_u64() % (text.len() as u64 + 1)) as usize);
            what.push(format!("control byte {:#x} at {pos}", c as u32));
            text.insert(pos, c);
            true
        }
        6 => {
            let pos =
                floor_char_boundary(text, (rng.next_u64() % (text.len() as u64 + 1)) as usize);
            what.push(format!("truncated at {pos}"));
            text.truncate(pos);
            false
        }
        7 => {
            // Inconsistent meshes and topologies: random small degrees.
            let keys = [
                "dp_shard",
                "dp_replicate",
                "tp",
                "ep",
                "cp",
                "dies_per_machine",
                "supernodes",
            ];
            let key = *pick(rng, &keys);
            let v = 1 + rng.next_u64() % 9;
            what.push(format!("{key} = {v}"));
            set_or_add(text, key, &v.to_string());
            false
        }
        _ => {
            let keys = [
                ("routing_skew", "nan"),
                ("routing_skew", "1e308"),
                ("routing_skew", "0.5"),
                ("prefetch_depth", "4294967296"),
                ("seq_len", "9223372036854775807"),
                ("global_batch", "4294967296"),
                ("seq_len", "268435456"),
            ];
            let (key, v) = *pick(rng, &keys);
            what.push(format!("{key} = {v}"));
            set_or_add(text, key, v)
        }
    }
}

/// Sets `key` where it is written; a key not written is left alone (returns false: the
/// mutation did nothing, so the input is not known to be invalid).
fn set_or_add(text: &mut String, key: &str, value: &str) -> bool {
    let lines = pair_lines(text, |k, _| k == key);
    let Some(&i) = lines.first() else {
        return false;
    };
    let (head, _, _, tail) = split_pair(text.lines().nth(i).unwrap()).unwrap();
    *text = replace_line(text, i, &format!("{head}{value}{tail}"));
    true
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Applies one mutation to the model file text; returns whether it surely made it invalid.
fn mutate_model(rng: &mut ChaCha8Rng, text: &mut String, what: &mut Vec<String>) -> bool {
    let dims = pair_lines(text, |k, v| MODEL_DIMS.contains(&k) && is_int(v));
    if dims.is_empty() {
        return false;
    }
    let i = *pick(rng, &dims);
    let (head, key, _, tail) = split_pair(text.lines().nth(i).unwrap()).unwrap();
    let (v, invalid) = match rng.next_u64() % 5 {
        0 => ("0".to_string(), MODEL_POSITIVE.contains(&key.as_str())),
        1 => ("-3".to_string(), true),
        2 => ("1000000000000".to_string(), true),
        3 => ("\"big\"".to_string(), true),
        _ => (format!("{}", 1 + rng.next_u64() % 200), false),
    };
    what.push(format!("model {key} = {v}"));
    *text = replace_line(text, i, &format!("{head}{v}{tail}"));
    invalid
}

/// Reads a corpus scenario and its model file; the scenario's model path is rewritten to the
/// copy the case writes beside it.
fn load_base(root: &Path, rel: &str) -> (String, String, String) {
    let path = root.join(rel);
    let text = std::fs::read_to_string(&path).unwrap();
    let (line, model_rel) = text
        .lines()
        .find_map(|l| {
            let (_, k, v, _) = split_pair(l)?;
            (k == "hf_config" || k == "compact")
                .then(|| (l.to_string(), v.trim_matches('"').to_string()))
        })
        .unwrap_or_else(|| panic!("{rel}: no model path"));
    let model_path = path.parent().unwrap().join(&model_rel);
    let model = std::fs::read_to_string(&model_path).unwrap();
    let ext = model_path
        .extension()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let key = if line.trim_start().starts_with("hf_config") {
        "hf_config"
    } else {
        "compact"
    };
    let text = text.replace(&line, &format!("{key} = \"model.{ext}\""));
    (text, model, ext)
}

fn generate(rng: &mut ChaCha8Rng, root: &Path) -> Case {
    let base = *pick(rng, CORPUS);
    let (mut scenario, mut model, model_ext) = load_base(root, base);
    let mut what = vec![base.to_string()];
    let mut invalid = false;
    // One or two mutations; none after a certainly-invalid one, which a later mutation could
    // undo (deleting a duplicated line).
    for _ in 0..1 + rng.next_u64() % 2 {
        if invalid {
            break;
        }
        invalid = if rng.next_u64().is_multiple_of(4) {
            mutate_model(rng, &mut model, &mut what)
        } else {
            mutate_scenario(rng, &mut scenario, &mut what)
        };
    }
    Case {
        scenario,
        model,
        model_ext,
        what,
        invalid,
    }
}

/// How one command ended.
enum Outcome {
    /// Exit status (0 ok, 1 lint refusal or failed check, 2 bad input).
    Exit(i32),
    /// A panic, a signal, an abort (allocation failure under the memory limit) or a timeout.
    Crash(String),
}

/// Runs `hpfsdp args` under the memory limit and timeout: how it ended, its stderr, and
/// whether it printed anything at all (stdout or stderr).
fn run_command(root: &Path, args: &[&str]) -> (Outcome, String, bool) {
    let bin = env!("CARGO_BIN_EXE_hpfsdp");
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let script = format!(
        "ulimit -v {MEMORY_LIMIT_KIB}; exec timeout -s KILL {TIMEOUT_S} '{bin}' {}",
        quoted.join(" ")
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .current_dir(root)
        .env("RUST_BACKTRACE", "0")
        // glibc reserves 64 MiB of address space per malloc arena (up to 8 per core), which
        // the address-space limit would count on a many-core machine.
        .env("MALLOC_ARENA_MAX", "2")
        .output()
        .expect("run sh");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let printed = !(stderr.trim().is_empty() && out.stdout.trim_ascii().is_empty());
    let outcome = match out.status.code() {
        Some(101) => Outcome::Crash("panic (exit 101)".into()),
        Some(137) => Outcome::Crash(format!("killed or timed out after {TIMEOUT_S} s")),
        None => Outcome::Crash(
            match std::os::unix::process::ExitStatusExt::signal(&out.status) {
                Some(6) => "aborted (SIGABRT: an allocation failure or abort())".into(),
                Some(9) => format!("killed (SIGKILL: the {TIMEOUT_S} s timeout or out of memory)"),
                s => format!("killed by signal {s:?}"),
            },
        ),
        Some(c) if c >= 124 => Outcome::Crash(format!("exit {c} (abort, signal or timeout)")),
        Some(c) if stderr.contains("panicked") => Outcome::Crash(format!("exit {c} after a panic")),
        Some(c) => Outcome::Exit(c),
    };
    (outcome, stderr, printed)
}

/// Runs `cases` generated cases from `seed`; panics listing every failing case.
fn fuzz(seed: u64, cases: usize) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir: PathBuf =
        std::env::temp_dir().join(format!("hpfsdp-fuzz-{}-{seed}", std::process::id()));
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Generated in order from the seed, then run on one worker per core (each case is three
    // single-threaded commands).
    let generated: Vec<Case> = (0..cases).map(|_| generate(&mut rng, root)).collect();
    let invalid_cases = generated.iter().filter(|c| c.invalid).count();
    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut failures: Vec<(usize, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut found = Vec::new();
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let Some(case) = generated.get(n) else {
                            return found;
                        };
                        found.extend(run_case(root, &dir, n, case).into_iter().map(|f| (n, f)));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    failures.sort();
    println!(
        "fuzz_scenarios: seed {seed}: {cases} cases ({invalid_cases} certainly invalid), {} commands in {:.1} s on {workers} workers, {} failure(s)",
        3 * cases,
        start.elapsed().as_secs_f64(),
        failures.len()
    );
    if failures.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let failures: Vec<String> = failures.into_iter().map(|(_, f)| f).collect();
    assert!(
        failures.is_empty(),
        "failing cases kept under {}:\n{}",
        dir.display(),
        failures.join("\n")
    );
}

/// Writes case `n` under `dir` and runs `plan`, `simulate` and `verify` on it; returns one
/// line per failing command (the case's files are kept when there is one).
fn run_case(root: &Path, dir: &Path, n: usize, case: &Case) -> Vec<String> {
    let case_dir = dir.join(format!("case-{n}"));
    std::fs::create_dir_all(&case_dir).unwrap();
    let scenario = case_dir.join("scenario.toml");
    std::fs::write(&scenario, &case.scenario).unwrap();
    std::fs::write(
        case_dir.join(format!("model.{}", case.model_ext)),
        &case.model,
    )
    .unwrap();
    let s = scenario.to_str().unwrap();
    let mut failures = Vec::new();
    for args in [
        vec!["plan", s],
        vec!["simulate", s, "--strategy", "hyperparallel"],
        vec!["verify", s],
    ] {
        let (outcome, stderr, _) = run_command(root, &args);
        let tail: String = stderr.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
        let problem = match outcome {
            Outcome::Crash(why) => Some(why),
            Outcome::Exit(0) if case.invalid => Some("exit 0 on an invalid input".into()),
            Outcome::Exit(2) if stderr.trim().is_empty() => Some("exit 2 without a message".into()),
            Outcome::Exit(_) => None,
        };
        if let Some(why) = problem {
            failures.push(format!(
                "case {n} [{}] `hpfsdp {}`: {why}; stderr: {tail}",
                case.what.join("; "),
                args[0]
            ));
        }
    }
    if failures.is_empty() {
        let _ = std::fs::remove_dir_all(&case_dir);
    }
    failures
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn fuzz_scenarios_bounded() {
    fuzz(
        env_or("HPFSDP_FUZZ_SEED", 12),
        env_or("HPFSDP_FUZZ_CASES", 150) as usize,
    );
}

#[test]
#[ignore = "long fuzzing run (5,000 cases, many minutes); run with --ignored"]
fn fuzz_scenarios_long() {
    fuzz(
        env_or("HPFSDP_FUZZ_SEED", 20261124),
        env_or("HPFSDP_FUZZ_CASES", 5000) as usize,
    );
}

/// Runs the command-line and file-kind cases; panics listing every failing one.
fn fuzz_inputs(cases: impl Fn(&Path, &Path) -> Vec<inputs::InputCase>, tag: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("hpfsdp-fuzz-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cases = cases(root, &dir);
    let start = Instant::now();
    let failures = inputs::run_cases(root, &cases);
    println!(
        "fuzz {tag}: {} cases in {:.1} s, {} failure(s)",
        cases.len(),
        start.elapsed().as_secs_f64(),
        failures.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn fuzz_special_files_where_files_are_read() {
    fuzz_inputs(inputs::file_cases, "files");
}

#[test]
fn fuzz_count_and_float_flags() {
    fuzz_inputs(|_, dir| inputs::flag_cases(dir), "flags");
}

#[test]
fn fuzz_replay_and_collbench_count_flags() {
    fuzz_inputs(
        |_, dir| inputs::replay_collbench_flag_cases(dir),
        "device-flags",
    );
}

#[test]
fn line_editing_keeps_keys_comments_and_json_commas() {
    let mut s = String::from("name = \"x\"\n[train]\nseq_len = 32 # tokens\n");
    assert!(set_or_add(&mut s, "seq_len", "0"));
    assert!(s.contains("seq_len = 0 # tokens"), "{s}");
    assert!(!set_or_add(&mut s, "absent", "1"));
    let (head, key, value, tail) = split_pair("  \"hidden_size\": 64,").unwrap();
    assert_eq!(
        (head.as_str(), key.as_str(), value.as_str(), tail.as_str()),
        ("  \"hidden_size\": ", "hidden_size", "64", ",")
    );
}
