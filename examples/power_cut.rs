//! Cuts the power of an image whose daemon ran in the power-cut test mode
//! (`CANOPY_POWERCUT_JOURNAL`, see `canopy::dev::powercut`) and died: puts
//! back what the writes no barrier covered overwrote, all of them or a
//! random version of each sector. Run by the crash campaign
//! (`scripts/crash_campaign.py --power-cut`) after it killed the daemon.
//!
//! Usage: power_cut IMAGE JOURNAL all
//!        power_cut IMAGE JOURNAL sectors SECTOR_BYTES SEED
//!
//! IMAGE is an image file or `rbd:POOL/IMAGE?conf=...`; an RBD image's
//! lock, which the killed daemon's client still holds, is taken over (its
//! client blocklisted, so nothing it left in flight lands afterwards).
//!
//! Prints one JSON line: the journal's records and bytes, and the bytes put back.

use canopy::dev::powercut::{cut_power, read_journal, Loss};
use canopy::dev::{Access, OpenHow, Source};
use std::path::Path;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn parse_loss(args: &[String]) -> Res<Loss> {
    match args {
        [how] if how == "all" => Ok(Loss::All),
        [how, sector, seed] if how == "sectors" => {
            let sector: u64 = sector.parse()?;
            if sector == 0 || !sector.is_power_of_two() {
                return Err(format!("sector size {sector}: a power of two expected").into());
            }
            Ok(Loss::Sectors {
                sector,
                seed: seed.parse()?,
            })
        }
        _ => Err("usage: power_cut IMAGE JOURNAL all | sectors SECTOR_BYTES SEED".into()),
    }
}

fn run() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [image, journal, rest @ ..] = args.as_slice() else {
        return Err("usage: power_cut IMAGE JOURNAL all | sectors SECTOR_BYTES SEED".into());
    };
    let loss = parse_loss(rest)?;
    let undos = read_journal(Path::new(journal))?;
    let source: Source = image.parse()?;
    let how = OpenHow {
        takeover: source.path().is_none(),
    };
    let dev = source.open(Access::Write, how)?;
    let changed = cut_power(dev.as_ref(), &undos, loss)?;
    dev.barrier()?;
    let lost_bytes: usize = undos.iter().map(|u| u.old.len()).sum();
    println!(
        "{}",
        serde_json::json!({"records": undos.len(), "bytes": lost_bytes, "bytes_put_back": changed})
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("power_cut: {e}");
        std::process::exit(1);
    }
}
