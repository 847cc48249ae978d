# A transformers-style device spec (TRANSFORMERS_TEST_DEVICE_SPEC), usable unchanged as a profile:
#   pytest suites --profile examples/profiles/cpu_spec.py
import torch

DEVICE_NAME = "cpu"
MANUAL_SEED_FN = torch.manual_seed
EMPTY_CACHE_FN = None
DEVICE_COUNT_FN = lambda: 1  # noqa: E731 - the spec format is module constants
