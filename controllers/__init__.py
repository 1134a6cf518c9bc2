"""Pure controller cores (RMA PID, SBM coverage and calibration, router, allocator, levers) and the
Faust app that hosts them (the one place importing faust).
"""
