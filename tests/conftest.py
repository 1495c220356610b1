import os
import sys

# tests/ holds shared helpers (fake_nvml, helpers.netns) imported by bare name.
sys.path.insert(0, os.path.dirname(__file__))
