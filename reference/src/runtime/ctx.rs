//! The per-rank execution context: the mode flag, the communicator, the rule table, the
//! compiled boundaries and the module stack. Every forward op goes through [`Ctx::op`] and
//! every module through [`Ctx::enter`] / [`Ctx::exit`] (and their backward twins); the mode
//! flag decides whether layouts are inferred and checked.

use std::collections::HashMap;

use hpfsdp_backends::Collective;
use hpfsdp_plan::{Layout, Placement};

use super::boundary::{BoundaryTable, ContractPair};
use super::dtensor::{DTensor, Meta, grad_layout, local_shape};
use super::error::{PlacementMismatch, RtResult, RuntimeError};
use super::mode::{DispatchStats, ExecMode};
use super::redistribute::{Step, apply_to_layout, execute_in};
use super::rules::{OpKind, RuleTable};
use super::topo::RankTopo;
use super::wire::ActDType;
use crate::tensor::Tensor;

/// One rank's execution context.
pub struct Ctx<'c> {
    /// The mode flag.
    pub mode: ExecMode,
    /// This rank's communicator.
    pub comm: &'c dyn Collective,
    /// Where this rank sits.
    pub topo: RankTopo,
    /// Dispatch counters.
    pub stats: DispatchStats,
    /// Element type of activations in model-parallel collectives (the compute dtype; f32
    /// unless set with [`Ctx::with_activation_dtype`]).
    pub act_dtype: ActDType,
    boundaries: &'c BoundaryTable,
    rules: RuleTable,
    stack: Vec<String>,
    /// Validation: the propagated output layout of each module's body in the last forward.
    body_out: HashMap<String, Layout>,
}

fn fmt_placements(mesh: &hpfsdp_plan::DeviceMesh, ps: &[Placement]) -> String {
    let v: Vec<String> = ps
        .iter()
        .zip(mesh.axes())
        .map(|(p, a)| format!("{}={p}", a.name))
        .collect();
    format!("({})", v.join(", "))
}

impl<'c> Ctx<'c> {
    /// A context for one rank.
    pub fn new(
        mode: ExecMode,
        comm: &'c dyn Collective,
        topo: RankTopo,
        boundaries: &'c BoundaryTable,
    ) -> Ctx<'c> {
        Ctx {
            mode,
            comm,
            topo,
            stats: DispatchStats::default(),
            act_dtype: ActDType::F32,
            boundaries,
            rules: RuleTable::new(),
            stack: Vec::new(),
            body_out: HashMap::new(),
        }
    }

    /// The same context with activations travelling in `dtype` (the step program's compute
    /// dtype) in every boundary transition and expert-parallel all-to-all.
    pub fn with_activation_dtype(mut self, dtype: ActDType) -> Ctx<'c> {
        self.act_dtype = dtype;
        self
    }

    /// The innermost module being executed (`<model>` outside every module).
    pub fn current_module(&self) -> String {
        self.stack
            .last()
            .cloned()
            .unwrap_or_else(|| "<model>".into())
    }

    /// Forward dispatch of one op: in validation mode infer the output layout from the rule
    /// table (failing with the current module named), run `f`, and check the local output
    /// shape against the inferred layout. Production mode only runs `f`.
    /// `global` is the output's global shape (static, known in both modes).
    pub fn op<R>(
        &mut self,
        op: OpKind,
        inputs: &[Option<&Layout>],
        global: &[usize],
        f: impl FnOnce() -> RtResult<(Tensor<f32>, R)>,
    ) -> RtResult<(DTensor, R)> {
        self.stats.ops += 1;
        if !self.mode.validates() {
            let (t, r) = f()?;
            return Ok((DTensor::new(t, global.to_vec(), None), r));
        }
        let t0 = std::time::Instant::now();
        let layouts: Vec<Layout> = inputs
            .iter()
            .map(|l| {
                l.cloned().ok_or_else(|| RuntimeError::OpRule {
                    module: self.current_module(),
                    stage: "forward".into(),
                    op: op.name().into(),
                    detail: "an input carries no layout".into(),
                })
            })
            .collect::<RtResult<_>>()?;
        self.stats.rule_lookups += 1;
        let (inferred, hit) = self.rules.lookup(&op, &layouts, &self.topo.plan_mesh);
        if hit {
            self.stats.rule_cache_hits += 1;
        }
        let out = inferred.map_err(|detail| RuntimeError::OpRule {
            module: self.current_module(),
            stage: "forward".into(),
            op: op.name().into(),
            detail,
        })?;
        self.stats.validation_host_ns += t0.elapsed().as_nanos() as u64;
        let (t, r) = f()?;
        let t1 = std::time::Instant::now();
        self.stats.output_checks += 1;
        let want = local_shape(&out, &self.topo.plan_mesh, self.topo.plan_rank);
        let inferred_global: Vec<usize> = out.global_shape.iter().map(|&d| d as usize).collect();
        if inferred_global != global {
            return Err(RuntimeError::OutputCheck {
                module: self.current_module(),
                op: op.name().into(),
                detail: format!(
                    "inferred global shape {inferred_global:?}, the plan expects {global:?}"
                ),
            });
        }
        if t.shape() != want.as_slice() {
            return Err(RuntimeError::OutputCheck {
                module: self.current_module(),
                op: op.name().into(),
                detail: format!(
                    "inferred layout {out} gives local shape {want:?}, the kernel produced {:?}",
                    t.shape()
                ),
            });
        }
        self.stats.validation_host_ns += t1.elapsed().as_nanos() as u64;
        Ok((DTensor::new(t, global.to_vec(), Some(out)), r))
    }

    /// Backward dispatch of one local kernel (the runtime's backward is local autograd in
    /// both modes, as HyperParallel's DTensor is forward-only).
    pub fn bwd<R>(&mut self, f: impl FnOnce() -> RtResult<R>) -> RtResult<R> {
        self.stats.ops += 1;
        f()
    }

    fn check(
        &mut self,
        module: &str,
        stage: &str,
        contract: &str,
        tensor: &str,
        expected: &[Placement],
        actual: &Layout,
    ) -> RtResult<()> {
        let t0 = std::time::Instant::now();
        self.stats.contract_checks += 1;
        let same = actual.placements == expected;
        self.stats.validation_host_ns += t0.elapsed().as_nanos() as u64;
        if !same {
            return Err(RuntimeError::PlacementMismatch(Box::new(
                PlacementMismatch {
                    module: module.into(),
                    stage: stage.into(),
                    tensor: tensor.into(),
                    contract: contract.into(),
                    expected: fmt_placements(&self.topo.plan_mesh, expected),
                    actual: fmt_placements(&self.topo.plan_mesh, &actual.placements),
                },
            )));
        }
        Ok(())
    }

    /// Execute precompiled transition steps; in validation mode each step's precondition
    /// (Partial before a reduction, Shard before a gather, Replicate before a slice) is
    /// checked against the tensor's propagated layout first.
    fn run_steps(
        &mut self,
        module: &str,
        stage: &str,
        tensor: &str,
        steps: &[Step],
        x: DTensor,
    ) -> RtResult<DTensor> {
        self.stats.transitions += steps.len() as u64;
        let t0 = std::time::Instant::now();
        if let Some(l) = &x.layout {
            let mut cur = l.clone();
            for st in steps {
                let (axis, ok) = match st {
                    Step::AllReduce { axis } => (*axis, cur.placements[*axis].is_partial()),
                    Step::ReduceScatter { axis, .. } => (*axis, cur.placements[*axis].is_partial()),
                    Step::AllGather { axis, dim } => {
                        (*axis, cur.placements[*axis].shard_dim() == Some(*dim))
                    }
                    Step::Slice { axis, .. } => (*axis, cur.placements[*axis].is_replicate()),
                };
                if !ok {
                    let mut expected = cur.placements.clone();
                    expected[axis] = match st {
                        Step::AllReduce { .. } | Step::ReduceScatter { .. } => {
                            Placement::partial_sum()
                        }
                        Step::AllGather { dim, .. } => Placement::shard(*dim),
                        Step::Slice { .. } => Placement::Replicate,
                    };
                    self.stats.contract_checks += 1;
                    return Err(RuntimeError::PlacementMismatch(Box::new(
                        PlacementMismatch {
                            module: module.into(),
                            stage: stage.into(),
                            tensor: tensor.into(),
                            contract: "transition precondition".into(),
                            expected: fmt_placements(&self.topo.plan_mesh, &expected),
                            actual: fmt_placements(&self.topo.plan_mesh, &cur.placements),
                        },
                    )));
                }
                cur = apply_to_layout(&cur, st);
            }
            self.stats.validation_host_ns += t0.elapsed().as_nanos() as u64;
        }
        let layout = x
            .layout
            .map(|l| steps.iter().fold(l, |acc, s| apply_to_layout(&acc, s)));
        let local = execute_in(
            self.comm,
            &self.topo,
            steps,
            &x.global,
            x.local,
            self.act_dtype,
        )?;
        Ok(DTensor::new(local, x.global, layout))
    }

    fn contract(&self, module: &str, output: bool) -> Option<ContractPair> {
        self.boundaries.get(module).and_then(|b| {
            if output {
                b.output.clone()
            } else {
                b.input.clone()
            }
        })
    }

    /// Enter `module` in forward: check the input against `in_src`, run the precompiled
    /// `in_src → in_dst` transition, push the module.
    pub fn enter(&mut self, module: &str, x: DTensor) -> RtResult<DTensor> {
        let mut x = x;
        if let Some(c) = self.contract(module, false) {
            if let Some(l) = &x.layout {
                let l = l.clone();
                self.check(module, "forward input", "in_src", &c.tensor, &c.src, &l)?;
            }
            x = self.run_steps(module, "forward input", &c.tensor, &c.forward, x)?;
        }
        self.stack.push(module.to_string());
        Ok(x)
    }

    /// Leave `module` in forward: pop it, check the body's output against `out_src`, run the
    /// precompiled `out_src → out_dst` transition.
    pub fn exit(&mut self, module: &str, y: DTensor) -> RtResult<DTensor> {
        self.stack.pop();
        let mut y = y;
        if let Some(l) = &y.layout {
            self.body_out.insert(module.to_string(), l.clone());
        }
        if let Some(c) = self.contract(module, true) {
            if let Some(l) = &y.layout {
                let l = l.clone();
                self.check(module, "forward output", "out_src", &c.tensor, &c.src, &l)?;
            }
            y = self.run_steps(module, "forward output", &c.tensor, &c.forward, y)?;
        }
        Ok(y)
    }

    /// Enter `module` in backward with the gradient of its output: check it against the
    /// gradient layout of `out_dst`, run the adjoint transition, push the module.
    pub fn bwd_enter(&mut self, module: &str, dy: DTensor) -> RtResult<DTensor> {
        let mut dy = dy;
        if let Some(c) = self.contract(module, true) {
            if let Some(l) = &dy.layout {
                let l = l.clone();
                let want = grad_layout(&Layout {
                    global_shape: l.global_shape.clone(),
                    placements: c.dst.clone(),
                });
                self.check(
                    module,
                    "backward input",
                    "out_dst",
                    &c.tensor,
                    &want.placements,
                    &l,
                )?;
            }
            dy = self.run_steps(module, "backward input", &c.tensor, &c.backward, dy)?;
        }
        self.stack.push(module.to_string());
        Ok(dy)
    }

    /// Leave `module` in backward with the gradient of its input as the body produced it:
    /// in validation mode that gradient is `Partial` on every axis where the input was
    /// replicated and the body's propagated forward output was not; run the adjoint input transition and check the result against the gradient
    /// layout of `in_src`.
    pub fn bwd_exit(&mut self, module: &str, dx: Tensor<f32>, x: &Meta) -> RtResult<DTensor> {
        self.stack.pop();
        let layout = match (self.mode.validates(), x.layout.as_ref()) {
            (true, Some(xl)) => {
                let mut l = grad_layout(xl);
                if let Some(out) = self.body_out.get(module) {
                    for (a, p) in out.placements.iter().enumerate() {
                        if !p.is_replicate() && l.placements[a].is_replicate() {
                            l.placements[a] = Placement::partial_sum();
                        }
                    }
                }
                Some(l)
            }
            _ => None,
        };
        let mut g = DTensor::new(dx, x.global.clone(), layout);
        if let Some(c) = self.contract(module, false) {
            g = self.run_steps(module, "backward output", &c.tensor, &c.backward, g)?;
            if let Some(l) = &g.layout {
                let l = l.clone();
                let want = grad_layout(&Layout {
                    global_shape: l.global_shape.clone(),
                    placements: c.src.clone(),
                });
                self.check(
                    module,
                    "backward output",
                    "in_src",
                    &c.tensor,
                    &want.placements,
                    &l,
                )?;
            }
        }
        Ok(g)
    }

    /// Leave `module` in backward when its input (token ids) carries no gradient.
    pub fn bwd_exit_no_grad(&mut self, _module: &str) {
        self.stack.pop();
    }

    /// Number of cached layout rules.
    pub fn cached_rules(&self) -> usize {
        self.rules.len()
    }
}
