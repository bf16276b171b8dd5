use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// teamgpu: fair multi-team GPU sharing on Kubernetes DRA.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print every CustomResourceDefinition as multi-document YAML.
    Crd {
        /// Write one file per CRD and a kustomization.yaml into this folder instead (e.g. `crds`).
        #[arg(long)]
        output_dir: Option<std::path::PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd { output_dir: None } => {
            let yaml = teamgpu::crd::to_yaml().context("serializing the CRDs")?;
            std::io::stdout().write_all(yaml.as_bytes())?;
        }
        Command::Crd {
            output_dir: Some(dir),
        } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, content) in teamgpu::crd::files().context("serializing the CRDs")? {
                let path = dir.join(name);
                std::fs::write(&path, content)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    Ok(())
}
