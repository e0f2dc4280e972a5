"""Example models built on the package's layers: `hybrid` (a Qwen3.5-style GDN + attention + MoE LM)."""
