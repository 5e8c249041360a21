//! `canopy generate`: man pages and shell completions, made from the
//! command definitions themselves so they never drift from `--help`
//! (`scripts/install.sh` installs both).

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Write a man page (section 8) for canopy and for each subcommand
    /// into DIR: canopy.8, canopy-mount.8, canopy-subvolume-create.8, ...
    Man {
        /// Directory to write the pages into (made if missing).
        dir: PathBuf,
    },
    /// Print the completion script for SHELL on standard output (bash,
    /// zsh, fish, elvish or powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

pub fn run(c: Command, cli: clap::Command) -> Result<()> {
    match c {
        Command::Man { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
            let mut cli = cli.disable_help_subcommand(true);
            cli.build();
            let written = write_pages(&cli, &dir)?;
            println!("{written} man pages in {}", dir.display());
            Ok(())
        }
        Command::Completions { shell } => {
            let mut cli = cli;
            clap_complete::generate(shell, &mut cli, "canopy", &mut std::io::stdout());
            Ok(())
        }
    }
}

/// Writes the page of `cmd` and of every subcommand below it into `dir`;
/// the number of pages written.
fn write_pages(cmd: &clap::Command, dir: &Path) -> Result<usize> {
    let mut written = 0;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        written += write_pages(sub, dir)?;
    }
    let page = clap_mangen::Man::new(cmd.clone())
        .section("8")
        .manual("Canopy Manual")
        .source(format!("canopy {}", env!("CARGO_PKG_VERSION")));
    let path = page
        .generate_to(dir)
        .with_context(|| format!("writing a man page into {}", dir.display()))?;
    tracing::debug!(page = %path.display(), "written");
    Ok(written + 1)
}
