from accelkit.cli import main

raise SystemExit(main())
