//! `calibrate --from`: the collective-table fit recovers the latency and efficiency a table
//! was generated from (with the simulator's own formulas and a deterministic ±1% wobble, as a
//! real benchmark has), reports a residual per row, and bad tables are refused with the file,
//! line and column named; the GEMM table has the documented columns and efficiencies.

use hpfsdp_plan::{CollectiveKind, Tier};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::calibration::coll_table::{
    COLLECTIVE_COLUMNS, CollectiveRow, algbw_busbw, collective_name, fit_collective_table,
    parse_collective_table, predicted_s, tier_name,
};
use hpfsdp_sim::calibration::gemm_table::{gemm_table_csv, parse_gemm_table};
use hpfsdp_sim::calibration::params::set;

fn a3() -> HardwareProfile {
    HardwareProfile::builtin("ascend-910c-a3").unwrap()
}

/// A collbench-style table of `tier` generated from `latency_us` and `efficiency`, each time
/// wobbled by a fixed pattern of up to ±1%.
fn generated_table(tier: Tier, ranks: usize, latency_us: f64, efficiency: f64) -> String {
    let sizes: Vec<u64> = [10u32, 14, 18, 22, 26, 30]
        .iter()
        .map(|e| 1u64 << e)
        .collect();
    generated_table_with(tier, ranks, (latency_us, efficiency), None, &sizes)
}

/// As [`generated_table`], at the given sizes, with the truth's unaligned-buffer factor set
/// to `unaligned_factor` when given (the A3 profile's measured 0.5015 otherwise).
fn generated_table_with(
    tier: Tier,
    ranks: usize,
    (latency_us, efficiency): (f64, f64),
    unaligned_factor: Option<f64>,
    sizes: &[u64],
) -> String {
    let mut truth = a3();
    if let Some(f) = unaligned_factor {
        set(&mut truth, "calibration.unaligned_bandwidth_factor", f);
    }
    let key = match tier {
        Tier::IntraMachine => "tiers.intra_machine",
        Tier::IntraSupernode => "tiers.intra_supernode",
        Tier::InterSupernode => "tiers.inter_supernode",
    };
    set(&mut truth, &format!("{key}.latency_us"), latency_us);
    set(&mut truth, &format!("{key}.efficiency"), efficiency);
    let mut out = COLLECTIVE_COLUMNS.join(",");
    out.push('\n');
    out.push_str("# generated from known alpha/beta for the calibration tests\n");
    let wobble = [0.01, -0.007, 0.004, -0.01, 0.006, -0.003];
    let mut i = 0;
    for kind in [
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllReduce,
    ] {
        for &size in sizes {
            let row = CollectiveRow {
                line: 0,
                kind,
                size_bytes: size,
                time_us: 1.0,
                tier,
                ranks,
            };
            let t = predicted_s(&row, &truth) * (1.0 + wobble[i % wobble.len()]);
            i += 1;
            let (algbw, busbw) = algbw_busbw(kind, size, t, ranks);
            out.push_str(&format!(
                "{},{size},{},bfloat16,sum,-1,{:.3},{:.2},{:.2},0,{},{ranks}\n",
                collective_name(kind),
                size / 2,
                t * 1e6,
                algbw / 1e9,
                busbw / 1e9,
                tier_name(tier)
            ));
        }
    }
    out
}

#[test]
fn the_tier_fit_recovers_the_latency_and_efficiency_a_table_was_generated_from() {
    for (tier, ranks, alpha, eff) in [
        (Tier::IntraMachine, 16, 4.0, 0.62),
        (Tier::IntraSupernode, 32, 9.0, 0.45),
    ] {
        let text = generated_table(tier, ranks, alpha, eff);
        let rows = parse_collective_table(&text, "gen.csv").unwrap();
        assert_eq!(rows.len(), 18);
        let fit = fit_collective_table(&rows, &a3(), "gen.csv").unwrap();
        assert_eq!(fit.tiers.len(), 1);
        let f = &fit.tiers[0];
        assert_eq!(f.tier, tier);
        assert!(
            (f.efficiency / eff - 1.0).abs() < 0.03,
            "{tier:?}: efficiency {} vs {eff}",
            f.efficiency
        );
        assert!(
            (f.latency_us / alpha - 1.0).abs() < 0.10,
            "{tier:?}: latency {} vs {alpha}",
            f.latency_us
        );
        assert!(!f.efficiency_at_bound && !f.latency_at_bound);
        assert!(f.rms_relative_error() < 0.02, "{}", f.rms_relative_error());
        assert!(f.rows.iter().all(|r| r.relative_error().abs() < 0.03));
    }
}

#[test]
fn a_table_faster_than_nominal_pins_the_efficiency_at_its_bound() {
    let text = generated_table(Tier::IntraMachine, 8, 2.0, 1.0)
        .lines()
        .map(|l| {
            // Halve every time: twice the nominal bandwidth.
            let mut cells: Vec<String> = l.split(',').map(str::to_string).collect();
            if cells.len() == 12 && cells[6].parse::<f64>().is_ok() {
                cells[6] = format!("{:.3}", cells[6].parse::<f64>().unwrap() / 2.0);
            }
            cells.join(",")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let rows = parse_collective_table(&text, "fast.csv").unwrap();
    let fit = fit_collective_table(&rows, &a3(), "fast.csv").unwrap();
    assert!(fit.tiers[0].efficiency_at_bound);
    assert_eq!(fit.tiers[0].efficiency, 1.0);
}

/// Aligned sizes (powers of two) and unaligned ones (not multiples of 512 bytes per rank)
/// from one truth: the bandwidth-bound unaligned rows recover the factor, starting from a
/// profile that assumes no penalty, and the other rows the tier. A table with aligned rows only
/// fits no factor, and unaligned rows as fast as aligned ones pin it at 1.
#[test]
fn unaligned_rows_recover_the_unaligned_bandwidth_factor() {
    let mut start = a3();
    set(&mut start, "calibration.unaligned_bandwidth_factor", 1.0);
    let aligned: Vec<u64> = [16u32, 20, 24, 28].iter().map(|e| 1u64 << e).collect();
    // 16 ranks x 2-byte elements x an odd count: never a multiple of 512 bytes per rank.
    let unaligned: Vec<u64> = [4_099u64, 65_537, 1_048_573]
        .iter()
        .map(|c| c * 32)
        .collect();
    let sizes: Vec<u64> = aligned.iter().chain(&unaligned).copied().collect();
    let text = generated_table_with(Tier::IntraMachine, 16, (3.0, 0.6), Some(0.4), &sizes);
    let rows = parse_collective_table(&text, "gen.csv").unwrap();
    let fit = fit_collective_table(&rows, &start, "gen.csv").unwrap();
    let tier = &fit.tiers[0];
    assert!(
        (tier.efficiency / 0.6 - 1.0).abs() < 0.03,
        "{}",
        tier.efficiency
    );
    let u = fit.unaligned.as_ref().expect("an unaligned fit");
    // Every row is fitted once: the bandwidth-bound unaligned rows (at least the largest
    // unaligned size of each collective) fit the factor, the rest the tier.
    assert_eq!(tier.rows.len() + u.rows.len(), rows.len());
    assert!(u.rows.len() >= 3, "{}", u.rows.len());
    assert!(u.rows.iter().all(|r| unaligned.contains(&r.row.size_bytes)));
    assert!(u.rows.iter().any(|r| r.row.size_bytes == 1_048_573 * 32));
    assert!((u.factor / 0.4 - 1.0).abs() < 0.05, "factor {}", u.factor);
    assert!(!u.at_bound);
    assert!(u.rms_relative_error() < 0.03, "{}", u.rms_relative_error());

    let only_aligned = generated_table_with(Tier::IntraMachine, 16, (3.0, 0.6), None, &aligned);
    let rows = parse_collective_table(&only_aligned, "gen.csv").unwrap();
    assert_eq!(
        fit_collective_table(&rows, &start, "gen.csv")
            .unwrap()
            .unaligned,
        None
    );

    let no_penalty = generated_table_with(Tier::IntraMachine, 16, (3.0, 0.6), Some(1.0), &sizes);
    let rows = parse_collective_table(&no_penalty, "gen.csv").unwrap();
    let u = fit_collective_table(&rows, &start, "gen.csv")
        .unwrap()
        .unaligned
        .unwrap();
    assert!(u.factor > 0.97, "{}", u.factor);
}

#[test]
fn bad_collective_tables_name_the_file_line_and_column() {
    let good = generated_table(Tier::IntraMachine, 16, 4.0, 0.6);
    let err = parse_collective_table("size,time_us\n1,2\n", "x.csv")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("x.csv:1") && err.contains("collective,size"),
        "{err}"
    );
    let bad_kind = good.replacen("all_gather,1024", "gatherall,1024", 1);
    let err = parse_collective_table(&bad_kind, "x.csv")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("x.csv:3") && err.contains("'collective'"),
        "{err}"
    );
    let wrong_tier = good.replace(",intra-machine,", ",intra-supernode,");
    let rows = parse_collective_table(&wrong_tier, "x.csv").unwrap();
    let err = fit_collective_table(&rows, &a3(), "x.csv")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'tier'") && err.contains("intra-machine"),
        "{err}"
    );
    let one_size: String = good
        .lines()
        .filter(|l| l.starts_with("collective") || l.contains(",1024,"))
        .collect::<Vec<_>>()
        .join("\n");
    let rows = parse_collective_table(&one_size, "x.csv").unwrap();
    let err = fit_collective_table(&rows, &a3(), "x.csv")
        .unwrap_err()
        .to_string();
    assert!(err.contains("two different sizes"), "{err}");
}

#[test]
fn the_gemm_table_has_the_documented_columns_and_efficiencies() {
    let profile = a3();
    // 4096^3 GEMM: 2 * 4096^3 = 1.374e11 FLOP; at 376 TFLOPS peak that is 365.5 us.
    let text = "m,n,k,dtype,time_us\n4096,4096,4096,bf16,731.0\n1024,4096,4096,bf16,200.0\n";
    let rows = parse_gemm_table(text, "g.csv", &profile).unwrap();
    let csv = gemm_table_csv(&rows, &profile, "g.csv");
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("m,n,k,dtype,efficiency,source"));
    assert_eq!(
        lines.next(),
        Some("1024,4096,4096,bf16,0.456911,measured:g.csv:3 (200 us)")
    );
    assert_eq!(
        lines.next(),
        Some("4096,4096,4096,bf16,0.500040,measured:g.csv:2 (731 us)")
    );
    let err = parse_gemm_table(
        "m,n,k,dtype,time_us\n4096,4096,4096,bf16,100\n",
        "g.csv",
        &profile,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("g.csv:2") && err.contains("peak"), "{err}");
    let err = parse_gemm_table("m,n,k,dtype,time_us\n0,1,1,bf16,1\n", "g.csv", &profile)
        .unwrap_err()
        .to_string();
    assert!(err.contains("'m'"), "{err}");
}
