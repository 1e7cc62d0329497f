"""The repository's spark-submit entry point: ``microcheckpoint/run_epoch.py``'s ``main``.

The job itself ships in the package (``microcheckpoint.run_epoch``, what the Airflow
operators submit); this file keeps ``spark-submit spark_jobs/run_epoch.py …`` and
``python spark_jobs/run_epoch.py …`` working from a checkout without an install.
"""

import sys
from pathlib import Path

# Run as a file: put the checkout first on the path, so its package is the one imported.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from microcheckpoint.run_epoch import main

if __name__ == "__main__":
    sys.exit(main())
