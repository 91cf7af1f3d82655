"""Whether this machine can run a target's module, asked before anything compiles.

`int8attn run --target cuda` (gfx942, or a packaged code object) compiles for
seconds before IREE's runtime would find that no such GPU is here; the HAL
driver answers the same question at once.
"""

from __future__ import annotations

import re

from .targets import OptionRefused, Target

# HAL drivers that run on this machine's CPU: always present.
_HOST_DRIVERS = frozenset({"local-task", "local-sync"})


def missing_device(driver: str) -> str | None:
    """Why IREE's `driver` has no device here (its own words), or None when it has
    one or cannot tell (the runtime then names what it finds when the module loads)."""
    if driver in _HOST_DRIVERS:
        return None
    try:
        import iree.runtime as rt

        devices = rt.get_driver(driver).query_available_devices()
    except RuntimeError as error:       # no driver library (libcuda, libamdhip64)
        # "Error creating driver: file.c:66: UNAVAILABLE; CUDA driver library 'libcuda.so'
        # ... not available; please ensure ...": the library's sentence
        found = re.search(r"UNAVAILABLE; (.*?)(?:[;:] please|$)", str(error), re.M)
        return found.group(1).strip() if found else "its driver could not be created"
    except Exception:  # noqa: BLE001  (an unknown driver name, a runtime without it)
        return None
    return None if devices else f"IREE's {driver} driver finds no device"


def check_runs_here(target: Target, kernel_object: str | None = None,
                    graph: str = "GRAPH") -> None:
    """Refuse (OptionRefused) running `target`'s module (with `kernel_object`, a code
    object's) where its IREE driver has no device. A target without an IREE runtime
    is refused by the compile itself."""
    driver = target.object_runtime_driver if kernel_object else target.runtime_driver
    why = None if driver is None else missing_device(driver)
    if why is None:
        return
    simulate = (" run the lane kernels in the lane simulator with --simulate "
                "(simulate=True in the Python API), or" if target.simulates and not kernel_object
                else "")
    packaged = f" --kernel-object {kernel_object}" if kernel_object else ""
    raise OptionRefused(f"--target {target.name} runs its module on IREE's {driver} driver, "
                        f"and no {driver} device is present here ({why}):{simulate} compile "
                        f"it here with `int8attn compile {graph} --target {target.name}"
                        f"{packaged} -o module.vmfb` and run it on a machine with the GPU")
