"""Runs `ptrun.bench.lora_memory` (its docstring says what it measures and how)."""

from ptrun.bench.lora_memory import main

if __name__ == "__main__":
    main()
