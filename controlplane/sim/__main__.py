from controlplane.sim.cli import main

raise SystemExit(main())
