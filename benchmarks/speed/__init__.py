"""How fast our own code runs: workload generation, simulation, capacity search, comparison."""
