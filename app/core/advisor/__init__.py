"""The hardware advisor's parts: the workload and its answer (``records``), the catalog machines and
presets it sweeps (``configs``), the sweep's shared state and the cheap bounds that settle most
configurations before any estimate (``sweep``), and launch commands (``commands``). What it lists
for a machine is what the estimate service says for that machine (``app.services.advisor``)."""
