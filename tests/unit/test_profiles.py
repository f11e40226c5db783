"""The Snakemake profiles: the default one makes plain `snakemake` use every core and
run measuring jobs one at a time; the SLURM one only names rules that exist."""

from __future__ import annotations

import re

import yaml


def _rule_names(repo_root) -> set[str]:
    names = set()
    for path in (repo_root / "workflow/rules").glob("*.smk"):
        names.update(re.findall(r"^rule (\w+):", path.read_text(), flags=re.M))
    return names


def test_default_profile_uses_all_cores_and_one_measuring_job(repo_root):
    profile = yaml.safe_load((repo_root / "profiles/default/config.yaml").read_text())
    assert profile["cores"] == "all"
    assert "measure=1" in profile["resources"]


def test_measuring_rules_take_the_measure_resource(repo_root):
    for stage in ("bench", "profile", "validate"):
        text = (repo_root / f"workflow/rules/{stage}.smk").read_text()
        body = text.split(f"rule {stage}:", 1)[1].split("\nrule ", 1)[0]
        assert re.search(r"resources:\s*\n\s*measure=1", body), stage
        # and every core, so that no other job runs beside it on this machine
        assert "threads: workflow.cores" in body, stage


def test_slurm_profile_names_only_existing_rules(repo_root):
    profile = yaml.safe_load((repo_root / "workflow/profiles/slurm/config.yaml").read_text())
    assert profile["executor"] == "slurm"
    assert profile["cores"] >= max(profile["set-threads"].values())  # no job's threads capped
    rules = _rule_names(repo_root)
    named = set(profile["set-resources"]) | set(profile["set-threads"])
    assert named <= rules, named - rules
    for stage in ("bench", "profile", "validate"):  # measuring jobs get whole nodes
        assert "--exclusive" in profile["set-resources"][stage]["slurm_extra"]
        # GPUs come from the config (the rules), never from the profile
        assert not {"gres", "gpu", "slurm_partition"} & set(profile["set-resources"][stage])






