"""What `vulture` (pyproject.toml's [tool.vulture], run by .ci/run) cannot see used:
names used from outside Python, by name in a string, or by a framework. Every other
definition nothing references is removed rather than listed here."""

# ruff: noqa
_ = object()

# The workflow imports these in Snakefile, workflow/rules/common.smk and the
# profiles' `config.yaml` (not Python files vulture reads)
stop_on_missing_configfiles
check_config_keys
check_store
log_invocation
# a WorkloadSpec names its builder as "module:function" (cli/validate.py, tests)
profile_model_workload
# mkdocs' hook (mkdocs.yml: hooks: docs/gen_pages.py)
on_files
on_page_markdown
# signal handlers take (signum, frame)
signum
# argparse reads the parser's formatter_class and calls its overridden hooks
_.formatter_class
_._split_lines  # cli/common.py HelpFormatter
# a hook's handle is kept with the bucket that registered it (validate/data_parallel.py)
_._handles
# record fields: part of the result a caller reads, whether or not paraplan does
estimated_fitting  # plan/transformer/search.py PlanResult
memory_capacity_bytes  # predict/predictor.py RunPrediction
# enum members: an IntEnum names every code its table stores (core/glossary.py EventKindCode)
ALLGATHER
RECV
# http.server's request handler hooks (tests/integration/test_tracking_lifecycle.py)
do_POST
_.log_message
_.daemon_threads
# fixtures a test requests for their side effect only
one_thread
keep_threads
# result-column specs that cli/report.py looks up by name (getattr(read, kind)) after a lazy import
VALIDATION
PREDICTION
LLM_PLAN
SIMULATION
COMPARISON
