"""What the tests, the demo, the benchmarks and the docs share: real servers on loopback and the ground truths
they are checked against. Not installed with the package; run from the repository root.

- Ground truths: the live speculative loops (`live_loop.py`, `eagle3_live_loop.py`, an MTP head's
  greedy loop written from vLLM's MTP model files in `mtp_reference.py`), speculative
  sampling at T > 0 as vLLM's rejection sampler does it (`speculative_sampling.py`), every anchor
  drafted (`all_anchor.py`), taps taken in-process with the server's hooks (`taps.py`), tensors
  between the wire and torch (`tensors.py`).
- Drafters and checkpoints: the tiny DFlash trainer (`tiny_trainer.py`), EAGLE-3 drafters
  (`eagle3.py`), checkpoint writers (`checkpoints.py`), the peers' own writers run in their virtual
  environment (`peer_checkpoints.py`, driven by `peers.py`), and SpecForge's own offline reader and
  DFlash training step over exported `.ckpt` files (`peer_specforge.py`), speculators' EAGLE-3 training
  fed from its offline files and from the cache (`peer_training.py`), both peers' loss masks of a chat
  (`peer_masks.py`), tiny DeepSeek-V3, Qwen3-Next and Qwen3.5
  targets carrying MTP heads under their published names (`mtp_targets.py`), an MTP head fine-tuned on
  cached states and saved as an MTP-only checkpoint (`mtp_trainer.py`).
- Reports: a leaderboard's worth of evaluation reports built from round taus (`leaderboard_reports.py`).
- Servers: `cache-server serve` and bench servers (`servers.py`), several on one store (`fleet.py`),
  vLLM (`engine.py`, with connectors that misbehave on purpose in `engine_faults/`), a lossless
  speculative-sampling test engine with vLLM's API (`spec_engine.py`), Postgres (`postgres.py`),
  moto's S3 (`s3.py`), headless Chromium (`browser.py`), a Docker engine and the images (`docker.py`).
- Crash consistency of the store: file-system operations recorded, and broken protocols
  (`file_ops_log.py`), every disk state a power loss may leave, materialised and checked
  (`crash_states.py`), each S3 write faulted in turn (`s3_faults.py`), and the workloads and what a
  store must show after a crash (`store_check.py`).
- The docs site's reference pages, generated from the parsers, settings, OpenAPI document and error
  and exit codes (`reference_pages.py`), its tutorials' shell blocks, run as written (`tutorials.py`), and the
  heavy modules a command line loads (`imports.py`).
"""
