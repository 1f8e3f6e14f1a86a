# flakebot-magic's own flake.
#   nix develop        a shell to work on it: python with the package's dependencies,
#                      cargo, rustc, clippy, rust-analyzer, nix, git
#   nix build          the flakebot-magic package (result/bin/flakebot)
#   nix run .#lab      JupyterLab whose default kernel loads the %%flakebot magic
#   nix flake check    builds the package and imports it
# Offline (CI, `make test`), against the small nixpkgs TEST STAND-IN in tests/:
#   nix flake check --override-input nixpkgs path:./tests/nixpkgs
{
  description = "flakebot-magic: turn a request into a compiled, tested, reproducible Rust tool, from Jupyter";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-24.05";

  outputs = { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAllSystems = f: lib.genAttrs systems (system: f system nixpkgs.legacyPackages.${system});

      # pyproject.toml's dependencies and its [test] extra, by their nixpkgs names
      runtimeDeps = ps: [
        ps.ipython ps.ipywidgets ps.jupyter-server ps.httpx ps.openai ps.platformdirs ps.pygit2 ps.tomlkit ps.traitlets
      ];
      testDeps = ps: [ ps.pytest ps.nbval ps.ipykernel ps.nbconvert ps.nbformat ps.jupyterlab ];

      package = pkgs: pkgs.python3Packages.buildPythonPackage {
        pname = "flakebot-magic";
        version = "0.1.0";
        pyproject = true;
        src = ./.;
        build-system = [ pkgs.python3Packages.hatchling ];
        dependencies = runtimeDeps pkgs.python3Packages;
        pythonImportsCheck = [ "flakebot_magic" ];
        meta = {
          description = "A Jupyter magic that turns a request into a compiled, tested, reproducible Rust tool";
          license = lib.licenses.mit;
          mainProgram = "flakebot";
        };
      };

      # A kernel spec whose kernel runs `%load_ext flakebot_magic` at start,
      # and the server extension's switch when the source has it.
      labFiles = pkgs: env: {
        kernel = pkgs.writeTextDir "share/jupyter/kernels/flakebot/kernel.json" (builtins.toJSON {
          argv = [ "${env}/bin/python3" "-m" "ipykernel_launcher" "-f" "{connection_file}" "--ext=flakebot_magic" ];
          display_name = "Python 3 (flakebot)";
          language = "python";
        });
        serverConfig = pkgs.writeTextDir "etc/jupyter/jupyter_server_config.d/flakebot_magic.json" (builtins.toJSON {
          ServerApp.jpserver_extensions."flakebot_magic.server" = builtins.pathExists ./flakebot_magic/server/__init__.py;
        });
      };

      lab = pkgs:
        let
          env = pkgs.python3.withPackages (ps: [ (package pkgs) ps.jupyterlab ps.ipykernel ] ++ runtimeDeps ps);
          files = labFiles pkgs env;
        in
        pkgs.writeShellScriptBin "flakebot-lab" ''
          # JupyterLab with the flakebot magic loaded in its default kernel
          export JUPYTER_PATH="${files.kernel}/share/jupyter''${JUPYTER_PATH:+:$JUPYTER_PATH}"
          export JUPYTER_CONFIG_PATH="${files.serverConfig}/etc/jupyter''${JUPYTER_CONFIG_PATH:+:$JUPYTER_CONFIG_PATH}"
          exec ${env}/bin/python3 -m jupyterlab --MappingKernelManager.default_kernel_name=flakebot "$@"
        '';
    in
    {
      packages = forAllSystems (system: pkgs: {
        default = package pkgs;
        lab = lab pkgs;
      });

      apps = forAllSystems (system: pkgs: {
        lab = {
          type = "app";
          program = "${self.packages.${system}.lab}/bin/flakebot-lab";
        };
        default = {
          type = "app";
          program = "${self.packages.${system}.default}/bin/flakebot";
        };
      });

      devShells = forAllSystems (system: pkgs: {
        default = pkgs.mkShell {
          packages = [
            (pkgs.python3.withPackages (ps: runtimeDeps ps ++ testDeps ps ++ [ ps.hatchling ]))
            pkgs.cargo
            pkgs.rustc
            pkgs.clippy
            pkgs.rust-analyzer
            pkgs.nix
            pkgs.git
          ];
        };
      });

      checks = forAllSystems (system: pkgs: {
        package = self.packages.${system}.default;
        lab = self.packages.${system}.lab;
      });
    };
}
