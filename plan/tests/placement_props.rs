//! Property tests of layouts and transitions over random shapes, meshes and placements:
//! shard-then-gather is the identity, local pieces tile the tensor exactly, and every lowered
//! transition, executed step by step by a small simulated executor, yields the destination
//! shards on every rank.

use hpfsdp_plan::layout::{gather_tensor, shard_tensor, sum_partials};
use hpfsdp_plan::transition::{TransitionAction, TransitionPlan, lower_transition};
use hpfsdp_plan::{CollectiveKind, DeviceMesh, Layout, Placement, ReduceOp, Topology};
use proptest::prelude::*;
use std::collections::HashMap;

/// Builds a valid layout from random choices; `choices` near zero give simple placements.
fn build_layout(shape: &[u64], mesh: &DeviceMesh, choices: &[u32], allow_partial: bool) -> Layout {
    let n = mesh.ndim();
    let ndim = shape.len();
    let c = |i: usize| choices[i % choices.len()] as usize;
    if c(0) % 7 == 6 {
        // Ragged: one axis, dims leading dims, units summing to a divisor of the cells.
        let axis = c(1) % n;
        let dims = 1 + c(2) % ndim;
        let prefix: u64 = shape[..dims].iter().product();
        let divisors: Vec<u64> = (1..=prefix).filter(|d| prefix.is_multiple_of(*d)).collect();
        let total = divisors[c(3) % divisors.len()];
        let k = mesh.axes()[axis].size;
        let mut units = Vec::with_capacity(k);
        let mut left = total;
        for i in 0..k - 1 {
            let u = c(4 + i) as u64 % (left + 1);
            units.push(u);
            left -= u;
        }
        units.push(left);
        units.rotate_left(c(9) % k);
        let mut ps = vec![Placement::Replicate; n];
        ps[axis] = Placement::RaggedShard {
            dims,
            local_units: units,
        };
        return Layout::new(shape.to_vec(), ps, mesh).expect("generated ragged layout is valid");
    }
    let kinds = if allow_partial { 5 } else { 4 };
    let ps = (0..n)
        .map(|a| {
            let dim = c(3 * a + 2) % ndim;
            match c(3 * a + 1) % kinds {
                0 => Placement::Replicate,
                1 | 2 => Placement::Shard { dim },
                3 => Placement::StridedShard {
                    dim,
                    split_factor: 1 + c(3 * a + 3) % 3,
                },
                _ => Placement::partial_sum(),
            }
        })
        .collect();
    Layout::new(shape.to_vec(), ps, mesh).expect("generated layout is valid")
}

fn make_mesh(sizes: &[usize]) -> DeviceMesh {
    DeviceMesh::new(sizes.iter().enumerate().map(|(i, &s)| (format!("m{i}"), s))).unwrap()
}

fn global_values(layout: &Layout) -> Vec<f64> {
    (0..layout.global_numel())
        .map(|e| ((e * 7) % 23) as f64 - 5.0)
        .collect()
}

/// Per-rank values of a (possibly `Partial`) layout whose partial sums are `global`: ranks at
/// partial coordinate 0 hold the global value minus the small integer noise the others hold.
/// Replicas (same coordinates on every sharding and partial axis) hold identical values.
fn partial_locals(global: &[f64], layout: &Layout, mesh: &DeviceMesh, seed: u64) -> Vec<Vec<f64>> {
    let paxes: Vec<usize> = (0..mesh.ndim())
        .filter(|&a| layout.placements[a].is_partial())
        .collect();
    let combos: usize = paxes.iter().map(|&a| mesh.axes()[a].size).product();
    let noise = |e: u64, combo: usize| ((e * 31 + combo as u64 * 17 + seed) % 7) as f64 - 3.0;
    (0..mesh.world_size())
        .map(|rank| {
            let coords = mesh.coords_of(rank);
            let combo = paxes
                .iter()
                .fold(0usize, |acc, &a| acc * mesh.axes()[a].size + coords[a]);
            layout
                .local_element_indices(mesh, rank)
                .into_iter()
                .map(|e| {
                    if combo == 0 {
                        global[e as usize] - (1..combos).map(|c| noise(e, c)).sum::<f64>()
                    } else {
                        noise(e, combo)
                    }
                })
                .collect()
        })
        .collect()
}

fn locals_for(global: &[f64], layout: &Layout, mesh: &DeviceMesh, seed: u64) -> Vec<Vec<f64>> {
    if layout.has_partial() {
        partial_locals(global, layout, mesh, seed)
    } else {
        (0..mesh.world_size())
            .map(|r| shard_tensor(global, layout, mesh, r).unwrap())
            .collect()
    }
}

/// Executes the steps of `plan` on per-rank buffers, moving data only inside the process
/// groups along each step's axis (local steps read only the rank's own buffer), and checks
/// the semantics of every collective on the way.
fn execute(plan: &TransitionPlan, mesh: &DeviceMesh, data: &mut [Vec<f64>], elem_bytes: u64) {
    let mut layout = plan.src.clone();
    for step in &plan.steps {
        let next = &step.layout;
        next.validate(mesh).expect("intermediate layout is valid");
        let a = step.mesh_axis;
        assert_eq!(layout.placements[a], step.from);
        assert_eq!(next.placements[a], step.to);
        for b in 0..mesh.ndim() {
            if b != a && layout.placements[b] != next.placements[b] {
                assert_eq!(mesh.axes()[b].size, 1, "step changed axis {b} too");
            }
        }
        assert_eq!(step.group_size, mesh.axes()[a].size);
        assert!(step.group_size > 1, "size-1 axes are folded");
        let old_idx: Vec<Vec<u64>> = (0..mesh.world_size())
            .map(|r| layout.local_element_indices(mesh, r))
            .collect();
        let new_idx: Vec<Vec<u64>> = (0..mesh.world_size())
            .map(|r| next.local_element_indices(mesh, r))
            .collect();
        for r in 0..mesh.world_size() {
            assert!(old_idx[r].len() as u64 * elem_bytes <= step.bytes_in_per_rank);
            assert!(new_idx[r].len() as u64 * elem_bytes <= step.bytes_out_per_rank);
        }
        let mut out: Vec<Vec<f64>> = vec![Vec::new(); data.len()];
        for group in mesh.groups(&[a]) {
            let lookup = |members: &[usize]| {
                let mut map: HashMap<u64, f64> = HashMap::new();
                for &m in members {
                    for (&e, &v) in old_idx[m].iter().zip(&data[m]) {
                        if let Some(prev) = map.insert(e, v) {
                            assert_eq!(prev, v, "replicas disagree on element {e}");
                        }
                    }
                }
                map
            };
            match step.action {
                TransitionAction::Collective(
                    kind @ (CollectiveKind::AllGather
                    | CollectiveKind::AllToAll
                    | CollectiveKind::AllToAllV),
                ) => {
                    if kind == CollectiveKind::AllGather {
                        assert!(group.iter().all(|&r| new_idx[r] == new_idx[group[0]]));
                    }
                    let map = lookup(&group);
                    for &r in &group {
                        out[r] = new_idx[r]
                            .iter()
                            .map(|e| *map.get(e).expect("group holds every element it needs"))
                            .collect();
                    }
                }
                TransitionAction::Collective(
                    kind @ (CollectiveKind::AllReduce | CollectiveKind::ReduceScatter),
                ) => {
                    assert!(group.iter().all(|&r| old_idx[r] == old_idx[group[0]]));
                    let mut sum = vec![0.0; data[group[0]].len()];
                    for &r in &group {
                        for (s, v) in sum.iter_mut().zip(&data[r]) {
                            *s += v;
                        }
                    }
                    let map: HashMap<u64, f64> =
                        old_idx[group[0]].iter().copied().zip(sum).collect();
                    for &r in &group {
                        if kind == CollectiveKind::AllReduce {
                            assert_eq!(new_idx[r], old_idx[r]);
                        }
                        out[r] = new_idx[r].iter().map(|e| map[e]).collect();
                    }
                }
                TransitionAction::LocalSlice => {
                    for &r in &group {
                        let map = lookup(&[r]);
                        out[r] = new_idx[r]
                            .iter()
                            .map(|e| *map.get(e).expect("a local slice needs no communication"))
                            .collect();
                    }
                }
                TransitionAction::LocalPartial => {
                    let zero_others = matches!(step.to, Placement::Partial { op: ReduceOp::Sum });
                    for (i, &r) in group.iter().enumerate() {
                        assert_eq!(new_idx[r], old_idx[r]);
                        out[r] = if zero_others && i != 0 {
                            vec![0.0; data[r].len()]
                        } else {
                            data[r].clone()
                        };
                    }
                }
                TransitionAction::Collective(other) => panic!("unexpected collective {other}"),
            }
        }
        for (d, o) in data.iter_mut().zip(out) {
            *d = o;
        }
        layout = next.clone();
    }
    for b in 0..mesh.ndim() {
        if layout.placements[b] != plan.dst.placements[b] {
            assert_eq!(
                mesh.axes()[b].size,
                1,
                "plan ends off its destination on axis {b}"
            );
        }
    }
}

fn case() -> impl Strategy<Value = (Vec<u64>, Vec<usize>, Vec<u32>, Vec<u32>)> {
    (
        prop::collection::vec(1u64..=7, 1..=3),
        prop::collection::vec(1usize..=4, 1..=3),
        prop::collection::vec(0u32..64, 12),
        prop::collection::vec(0u32..64, 12),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn shard_then_gather_is_identity((shape, sizes, ca, _cb) in case()) {
        let mesh = make_mesh(&sizes);
        let layout = build_layout(&shape, &mesh, &ca, true);
        let global = global_values(&layout);
        let locals = locals_for(&global, &layout, &mesh, 3);
        let whole = if layout.has_partial() {
            sum_partials(&locals, &layout, &mesh).unwrap()
        } else {
            locals
        };
        let back = gather_tensor(&whole, &layout.without_partials(), &mesh).unwrap();
        prop_assert_eq!(back, global);
    }

    #[test]
    fn local_pieces_tile_the_tensor((shape, sizes, ca, _cb) in case()) {
        let mesh = make_mesh(&sizes);
        let layout = build_layout(&shape, &mesh, &ca, true);
        let numel = layout.global_numel() as usize;
        let global: Vec<f64> = (0..numel).map(|e| e as f64).collect();
        let mut owners = vec![0u32; numel];
        let max_shape = layout.max_local_shape(&mesh);
        let mut shapes = Vec::new();
        for rank in 0..mesh.world_size() {
            let idx = layout.local_element_indices(&mesh, rank);
            let local_shape = layout.local_shape(&mesh, rank);
            prop_assert_eq!(idx.len() as u64, layout.local_numel(&mesh, rank));
            prop_assert_eq!(idx.len() as u64, local_shape.iter().product::<u64>());
            prop_assert!(local_shape.iter().zip(&max_shape).all(|(s, m)| s <= m));
            let as_f64: Vec<f64> = idx.iter().map(|&e| e as f64).collect();
            prop_assert_eq!(shard_tensor(&global, &layout, &mesh, rank).unwrap(), as_f64);
            let canonical = layout.canonical_rank(&mesh, rank);
            if canonical == rank {
                for &e in &idx {
                    owners[e as usize] += 1;
                }
            } else {
                prop_assert_eq!(&idx, &layout.local_element_indices(&mesh, canonical));
            }
            let sets = layout.local_index_sets(&mesh, rank);
            let boxed = sets.iter().all(|s| s.len() <= 1);
            match layout.local_offset(&mesh, rank) {
                Some(off) => {
                    prop_assert!(boxed);
                    for (s, o) in sets.iter().zip(off) {
                        if let Some(r) = s.first() {
                            prop_assert_eq!(r.start, o);
                        }
                    }
                }
                None => prop_assert!(!boxed),
            }
            shapes.push(local_shape);
        }
        prop_assert!(owners.iter().all(|&c| c == 1), "owners {:?}", owners);
        let canonical: Vec<usize> = (0..mesh.world_size())
            .filter(|&r| layout.canonical_rank(&mesh, r) == r)
            .collect();
        prop_assert_eq!(layout.canonical_ranks(&mesh), canonical);
        prop_assert_eq!(layout.is_even(&mesh), shapes.iter().all(|s| *s == shapes[0]));
    }

    #[test]
    fn lowered_transitions_reproduce_the_destination((shape, sizes, ca, cb) in case()) {
        let mesh = make_mesh(&sizes);
        let topo = Topology::new(mesh.world_size(), 1, 1).unwrap();
        let src = build_layout(&shape, &mesh, &ca, true);
        let dst = build_layout(&shape, &mesh, &cb, true);
        let global = global_values(&src);
        let mut data = locals_for(&global, &src, &mesh, 11);
        let plan = lower_transition(&src, &dst, &mesh, &topo, 2).unwrap();
        execute(&plan, &mesh, &mut data, 2);
        let result = if dst.has_partial() {
            sum_partials(&data, &dst, &mesh).unwrap()
        } else {
            data
        };
        for (rank, local) in result.iter().enumerate() {
            let want = shard_tensor(&global, &dst, &mesh, rank).unwrap();
            prop_assert_eq!(local, &want, "rank {} of {} -> {}", rank, src, dst);
        }
        // Identity transitions cost nothing.
        prop_assert!(lower_transition(&dst, &dst, &mesh, &topo, 2).unwrap().is_identity());
    }
    #[test]
    fn ragged_to_ragged_on_one_axis((shape, sizes, ca, cb) in case()) {
        let mesh = make_mesh(&sizes);
        let topo = Topology::new(mesh.world_size(), 1, 1).unwrap();
        let (mut ca, mut cb) = (ca, cb);
        ca[0] = 6;
        cb[0] = 6;
        cb[1] = ca[1];
        cb[2] = ca[2];
        let src = build_layout(&shape, &mesh, &ca, false);
        let dst = build_layout(&shape, &mesh, &cb, false);
        let global = global_values(&src);
        let mut data = locals_for(&global, &src, &mesh, 5);
        let plan = lower_transition(&src, &dst, &mesh, &topo, 4).unwrap();
        prop_assert!(plan.steps.len() <= 1);
        execute(&plan, &mesh, &mut data, 4);
        for (rank, local) in data.iter().enumerate() {
            prop_assert_eq!(local, &shard_tensor(&global, &dst, &mesh, rank).unwrap());
        }
    }
}
