//! `--dump`: one line per command, in the shape `btrfs receive --dump`
//! prints (command, path, then key=value pairs).

use super::{Command, Time};
use crate::format::uuid::shown as uuid;

fn p(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            ' ' | '\\' => {
                out.push('\\');
                out.push(ch);
            }
            c if c.is_control() => out.push_str(&format!("\\{:03o}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

fn time(t: Time) -> String {
    format!("{}.{:09}", t.sec, t.nsec)
}

/// The line for `c`; paths are shown under `subvol` (the subvolume's
/// path), as btrfs shows them.
pub fn dump_line(c: &Command, subvol: &[u8]) -> String {
    let at = |path: &[u8]| {
        let mut full = subvol.to_vec();
        if !path.is_empty() {
            full.push(b'/');
            full.extend_from_slice(path);
        }
        p(&full)
    };
    format!("{:<16}{}", c.name(), describe(c, &at))
        .trim_end()
        .to_string()
}

/// The command's path and values; `at` shows a path in the subvolume.
fn describe(c: &Command, at: &dyn Fn(&[u8]) -> String) -> String {
    match c {
        Command::Subvol {
            path,
            uuid: u,
            ctransid,
        } => format!("./{} uuid={} transid={ctransid}", p(path), uuid(u)),
        Command::Snapshot {
            path,
            uuid: u,
            ctransid,
            clone_uuid,
            clone_ctransid,
        } => format!(
            "./{} uuid={} transid={ctransid} parent_uuid={} parent_transid={clone_ctransid}",
            p(path),
            uuid(u),
            uuid(clone_uuid)
        ),
        Command::Mkfile { path, .. }
        | Command::Mkdir { path, .. }
        | Command::Mkfifo { path, .. }
        | Command::Mksock { path, .. }
        | Command::Unlink { path }
        | Command::Rmdir { path } => at(path),
        Command::Mknod {
            path, mode, rdev, ..
        } => format!("{} mode={mode:o} dev=0x{rdev:x}", at(path)),
        Command::Symlink { path, target, .. } => format!("{} dest={}", at(path), p(target)),
        Command::Rename { from, to } => format!("{} dest={}", at(from), at(to)),
        Command::Link { path, target } => format!("{} dest={}", at(path), p(target)),
        Command::SetXattr { path, name, data } => format!(
            "{} name={} data={} len={}",
            at(path),
            p(name),
            p(data),
            data.len()
        ),
        Command::RemoveXattr { path, name } => format!("{} name={}", at(path), p(name)),
        c => describe_data(c, at),
    }
}

fn describe_data(c: &Command, at: &dyn Fn(&[u8]) -> String) -> String {
    match c {
        Command::Write { path, offset, data } => {
            format!("{} offset={offset} len={}", at(path), data.len())
        }
        Command::Clone {
            path,
            offset,
            len,
            clone_path,
            clone_offset,
            ..
        } => format!(
            "{} offset={offset} len={len} from={} clone_offset={clone_offset}",
            at(path),
            p(clone_path)
        ),
        Command::Truncate { path, size } => format!("{} size={size}", at(path)),
        Command::Chmod { path, mode } => format!("{} mode={mode:o}", at(path)),
        Command::Chown { path, uid, gid } => format!("{} gid={gid} uid={uid}", at(path)),
        Command::Utimes {
            path,
            atime,
            mtime,
            ctime,
        } => format!(
            "{} atime={} mtime={} ctime={}",
            at(path),
            time(*atime),
            time(*mtime),
            time(*ctime)
        ),
        Command::UpdateExtent { path, offset, size } => {
            format!("{} offset={offset} len={size}", at(path))
        }
        Command::Fallocate {
            path,
            mode,
            offset,
            size,
        } => format!("{} mode={mode} offset={offset} len={size}", at(path)),
        Command::Fileattr { path, attr } => format!("{} fileattr=0x{attr:x}", at(path)),
        Command::EncodedWrite {
            path,
            offset,
            unencoded_file_len,
            unencoded_len,
            unencoded_offset,
            compression,
            encryption,
            data,
        } => format!(
            "{} offset={offset} len={} unencoded_file_len={unencoded_file_len} \
             unencoded_len={unencoded_len} unencoded_offset={unencoded_offset} \
             compression={compression} encryption={encryption}",
            at(path),
            data.len()
        ),
        _ => String::new(),
    }
}
