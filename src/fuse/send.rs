//! `canopy send` over the control socket. The daemon makes the stream
//! (it reads the trees); the command copies it to its output. After the
//! request line the daemon writes frames (u32 LE length, bytes), a
//! zero-length frame, then one JSON line: the summary or the error. A
//! frame whose length has bit 31 set is progress instead: a JSON summary
//! of what is sent so far. A send runs on its own thread, so other
//! commands are answered meanwhile.

use super::control::{open_request, parse_response, talking, write_response, Request, Response};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::send::{self, Summary};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

/// Bytes gathered before a frame is written.
const FRAME: usize = 1 << 20;
/// The length bit that marks a progress frame.
const PROGRESS: u32 = 1 << 31;

/// Writes what it is given as frames.
struct Frames<'a> {
    s: &'a UnixStream,
    buf: Vec<u8>,
}

impl Frames<'_> {
    fn emit(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        (&mut &*self.s).write_all(&len.to_le_bytes())?;
        (&mut &*self.s).write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }
}

impl Frames<'_> {
    /// Data so far, then a progress frame.
    fn progress(&mut self, s: &Summary) -> std::io::Result<()> {
        self.emit()?;
        let json = serde_json::to_vec(s).unwrap_or_default();
        let len = u32::try_from(json.len()).unwrap_or(0) | PROGRESS;
        (&mut &*self.s).write_all(&len.to_le_bytes())?;
        (&mut &*self.s).write_all(&json)
    }
}

/// The frames, shared by the stream and the progress reports.
struct Shared<'a, 'b>(&'a std::cell::RefCell<Frames<'b>>);

impl Write for Shared<'_, '_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().write(b)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

impl Write for Frames<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= FRAME {
            self.emit()?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.emit()
    }
}

/// Answers a send request on its own thread.
pub(super) fn serve(s: UnixStream, fs: Arc<Fs>, req: send::Request) {
    let spawned = std::thread::Builder::new()
        .name("canopy-send".into())
        .spawn(move || {
            if let Err(e) = stream_to(&s, &fs, &req) {
                tracing::warn!(error = %e, "send stopped");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a send thread");
    }
}

fn stream_to(s: &UnixStream, fs: &Fs, req: &send::Request) -> std::io::Result<()> {
    s.set_read_timeout(None)?;
    let frames = std::cell::RefCell::new(Frames {
        s,
        buf: Vec::with_capacity(FRAME + (64 << 10)),
    });
    let result = send::send(fs, req, &mut Shared(&frames), &mut |summary| {
        // A reader gone away shows at the next data write.
        let _ = frames.borrow_mut().progress(summary);
    });
    if result.is_ok() {
        frames.borrow_mut().emit()?;
    }
    (&mut &*s).write_all(&0u32.to_le_bytes())?;
    let resp = match result {
        Ok(summary) => Response {
            send: Some(summary),
            ..Response::ok()
        },
        Err(e) => {
            tracing::warn!(error = %e, "send failed");
            Response::failed(e)
        }
    };
    write_response(s, &resp)
}

/// Asks the daemon of `mountpoint` for a send and copies the stream to
/// `out`, calling `progress` with the bytes copied and the daemon's last
/// report (inodes sent of those to send).
pub fn request(
    mountpoint: &Path,
    req: &send::Request,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64, &Summary),
) -> Result<Summary> {
    let talk = |e| talking(mountpoint, e);
    let s = open_request(mountpoint, &Request::Send(req.clone()))?;
    let mut r = BufReader::with_capacity(FRAME, s);
    let mut buf = Vec::new();
    let mut copied = 0u64;
    let mut last = Summary::default();
    loop {
        let mut len = [0u8; 4];
        r.read_exact(&mut len).map_err(talk)?;
        let len = u32::from_le_bytes(len);
        if len & PROGRESS != 0 {
            buf.resize((len & !PROGRESS) as usize, 0);
            r.read_exact(&mut buf).map_err(talk)?;
            last = serde_json::from_slice(&buf).unwrap_or(last);
            progress(copied, &last);
            continue;
        }
        let len = len as usize;
        if len == 0 {
            break;
        }
        buf.resize(len, 0);
        r.read_exact(&mut buf).map_err(talk)?;
        out.write_all(&buf)
            .map_err(|e| Error::io("writing the stream", e))?;
        copied += len as u64;
        progress(copied, &last);
    }
    out.flush()
        .map_err(|e| Error::io("writing the stream", e))?;
    let mut answer = String::new();
    r.read_line(&mut answer).map_err(talk)?;
    let resp = parse_response(mountpoint, &answer)?;
    match (resp.ok, resp.send) {
        (true, Some(summary)) => Ok(summary),
        _ => Err(Error::Invalid(
            resp.error.unwrap_or_else(|| "send failed".into()),
        )),
    }
}
