"""solm simulator: hardware and model catalogs, a roofline cost model, SimPy replay of traces.

The simulator reads traces written by the profiler and never imports the runtime (it must run
where torch is absent). Modules: `hardware` and `models` (catalogs), `cost` (time of one forward
pass), `calibrate` (fitting the cost model to measured data). Nothing heavy is imported here.
"""
