"""The parts every builder of the engine's input (`paraplan.sim.execution.ExecutionModel`)
is made of, one file per part, each a pure function over frozen records:

- `placement`: which devices each pipeline stage uses, and how many nodes a group spans
  (a profile's device lists, or Megatron's rank order tp-cp-dp-pp);
- `grad_buckets`: how a rank's gradients are cut into reductions and when each is ready;
- `rank_memory`: a rank's weights, gradients, optimizer state and activations;
- `transformer_params`: a transformer's parameters on a rank outside its layers
  (embedding, positions, the last stage's norm, output layer and MTP weights).

The layer split they build on is `paraplan.core.layer_split` (core types split their
layers with it). `paraplan.sim.strategy_sim.profile_execution` (a layer profile's step)
is built from these parts; `paraplan.predict` (a transformer run: `placement`, `rank_state`) and the
planner's estimate (`paraplan.plan.transformer.estimate`) call them for node spans, buckets, memory
and the embedding and head parameters."""
