from pearl_cli.main import main

raise SystemExit(main())
