//! The header read and checked, and the small decoders of its fields.

use super::*;

/// The header's fields, checked: the magic, the version and the layout this reader knows.
impl TraceReader {
    /// A reader of the file whose header `headed` read, as `opts` says (not counted).
    pub(super) fn of_header(headed: Headed, opts: &ReadOptions) -> Result<TraceReader, ReadError> {
        let (mut file, meta, h, mut info) = headed;
        let file_len = meta.len();
        let in_file = slots_in(file_len);
        let wrapped = info.ring && info.claimed > info.capacity;
        let (mut start, end, mut truncated);
        let mut checkpoint = Vec::new();
        let mut unsummarized = le_u64(&h, header::SUMMARY_LOST);
        // A trace whose ring never lapped is read the same whichever checkpoint is asked for.
        let mut as_replay_reads = true;
        start = 0;
        truncated = 0;
        if wrapped {
            end = info.claimed;
            let oldest = info.claimed - info.capacity;
            start = oldest;
            info.checkpoint_refused = crate::trace::checkpoint::read::layout_lie(&h);
            let first = crate::trace::checkpoint::read::longest_first(&h, oldest);
            let read = read_checkpoint(&file, &h, file_len, oldest, opts.longest_ring);
            as_replay_reads = opts.longest_ring || read.as_ref().map(|(d, _)| d.seq) == first;
            if let Some((d, bodies)) = read {
                checkpoint = bodies;
                info.summarized = checkpoint_summarized(&checkpoint);
                if d.covered > oldest {
                    start = d.covered.min(end);
                } else {
                    unsummarized = unsummarized.saturating_add(oldest - d.covered);
                }
            } else {
                unsummarized = unsummarized.saturating_add(oldest);
            }
            let slot = start % info.capacity.max(1);
            io::Seek::seek(
                &mut file,
                io::SeekFrom::Start(
                    (HEADER_SIZE as u64).saturating_add(slot.saturating_mul(RECORD_SIZE as u64)),
                ),
            )
            .map_err(|e| ReadError::Io(info.path.clone(), e))?;
        } else {
            let written = info.claimed.min(info.capacity);
            end = written.min(in_file);
            truncated = written - end;
            io::Seek::seek(&mut file, io::SeekFrom::Start(HEADER_SIZE as u64))
                .map_err(|e| ReadError::Io(info.path.clone(), e))?;
        }
        let first_offset = io::Seek::stream_position(&mut file)
            .map_err(|e| ReadError::Io(info.path.clone(), e))?;
        let checkpoint = std::sync::Arc::new(checkpoint);
        let (summed, summed_bytes) = checkpoint_summed(&checkpoint);
        let stats = DecodeStats {
            lost: info.lost,
            truncated,
            unsummarized,
            summed,
            summed_bytes,
            definitions_dropped: le_u64(&h, header::DEFINITIONS_DROPPED),
            summarized_late: le_u64(&h, header::SUMMARY_LATE),
            ..DecodeStats::default()
        };
        let ring = if wrapped { info_capacity(&h) } else { 0 };
        let extent = (start, end, ring);
        let template = fork::Template::of(
            &file,
            &meta,
            &checkpoint,
            first_offset,
            &stats,
            extent,
            &opts.mode,
        );
        let decoder = template.decoder(file);
        let mut reader = TraceReader::at_start(info, decoder, template, stats, (start, end), opts);
        reader.as_replay_reads = as_replay_reads;
        Ok(reader)
    }

    /// The header of the trace at `path` (its run's command line, devices, ...), read alone:
    /// no checkpoint, no record, no pass.
    pub fn header(path: impl AsRef<Path>) -> Result<TraceInfo, ReadError> {
        open_header(path.as_ref()).map(|(_, _, _, info)| info)
    }

    /// Whether this reader reads the records a reader opened with
    /// [`ReadOptions::longest_ring`] would (a replay of PyTorch's allocator may then take its
    /// requests from this read).
    pub fn reads_as_replay(&self) -> bool {
        self.as_replay_reads
    }
}

/// A file, its metadata, its header's bytes and what they say.
pub(super) type Headed = (std::fs::File, std::fs::Metadata, Vec<u8>, TraceInfo);

/// Opens the trace at `path` ([`super::opening::open_named`]) and reads its header: the file
/// (at its first record), what it is, the header's bytes, and what they say.
pub(super) fn open_header(path: &Path) -> Result<Headed, ReadError> {
    let io_err = |e| ReadError::Io(path.to_path_buf(), e);
    let (file, meta) = super::opening::open_named(path).map_err(io_err)?;
    header_of(file, meta, path)
}

/// The header of `file` (opened at its start, `meta` its metadata), read and checked, as the
/// trace `path` names; the file left at its first record.
pub(super) fn header_of(
    mut file: std::fs::File,
    meta: std::fs::Metadata,
    path: &Path,
) -> Result<Headed, ReadError> {
    use std::io::Read;
    let path = path.to_path_buf();
    let io_err = |e| ReadError::Io(path.clone(), e);
    let file_len = meta.len();
    if file_len < HEADER_SIZE as u64 {
        return Err(ReadError::TooShort {
            path,
            len: file_len,
        });
    }
    let mut h = vec![0u8; HEADER_SIZE];
    file.read_exact(&mut h).map_err(io_err)?;
    let info = info_of(&h, path, file_len)?;
    Ok((file, meta, h, info))
}

/// What header `h` of a file of `file_len` bytes says, checked, the ring's fields too (what a
/// reader of the file learns from its header before any record: at its opening, and at each
/// look of a followed read).
pub(super) fn info_of(h: &[u8], path: PathBuf, file_len: u64) -> Result<TraceInfo, ReadError> {
    let mut info = read_header(h, path, file_len)?;
    info.ring = le_u64(h, header::RING) != 0;
    info.checkpoints_failed = le_u64(h, header::CHECKPOINTS_FAILED);
    Ok(info)
}

/// The record slots a file of `file_len` bytes holds whole.
pub(super) fn slots_in(file_len: u64) -> u64 {
    file_len.saturating_sub(HEADER_SIZE as u64) / RECORD_SIZE as u64
}

pub(super) fn read_header(h: &[u8], path: PathBuf, file_len: u64) -> Result<TraceInfo, ReadError> {
    if h[..8] != format::MAGIC {
        return Err(ReadError::BadMagic { path });
    }
    let version = le_u32(h, header::VERSION);
    if version != format::VERSION {
        return Err(ReadError::Version { path, version });
    }
    let record = le_u32(h, header::RECORD_SIZE);
    let hsize = le_u32(h, header::HEADER_SIZE);
    if record as usize != RECORD_SIZE || hsize as usize != HEADER_SIZE {
        return Err(ReadError::Layout {
            path,
            record,
            header: hsize,
        });
    }
    let cmdline = nul_list(&h[header::CMDLINE..header::CMDLINE + header::CMDLINE_LEN]);
    let env = nul_list(&h[header::ENV..header::ENV + header::ENV_LEN]);
    Ok(TraceInfo {
        version,
        pid: le_u32(h, header::PID),
        rank: le_u32(h, header::RANK) as i32,
        host: c_string(&h[header::HOST..header::HOST + header::HOST_LEN]),
        program: c_string(&h[header::PROGRAM..header::PROGRAM + header::PROGRAM_LEN]),
        cmdline,
        env,
        start_realtime_ns: le_u64(h, header::START_REALTIME_NS),
        clean_exit: le_u32(h, header::FLAGS) & format::FLAG_CLEAN_EXIT != 0,
        claimed: le_u64(h, header::CLAIMED),
        lost: le_u64(h, header::LOST),
        capacity: le_u64(h, header::CAPACITY),
        file_len,
        path,
        ring: false,
        summarized: 0,
        checkpoints_failed: 0,
        checkpoint_refused: None,
        devices: (0..header::DEVICES_MAX)
            .map(|d| {
                let w = le_u64(h, header::DEVICES + 8 * d);
                let (multiprocessors, threads_per_multiprocessor) = (w as u32, (w >> 32) as u32);
                (multiprocessors > 0 && threads_per_multiprocessor > 0).then_some(DeviceMake {
                    multiprocessors,
                    threads_per_multiprocessor,
                    memory: le_u64(h, header::DEVICE_MEMORY + 8 * d),
                })
            })
            .collect(),
    })
}

/// What a CUDA device is made of, as CUDA said in the run (`format::header::DEVICES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMake {
    pub multiprocessors: u32,
    pub threads_per_multiprocessor: u32,
    /// Its memory as CUDA counts it (`format::header::DEVICE_MEMORY`); 0 where not known.
    pub memory: u64,
}

/// NUL-separated strings (ending at a double NUL or the field's end), as text.
pub(super) fn nul_list(field: &[u8]) -> Vec<String> {
    let end = field
        .windows(2)
        .position(|w| w == [0, 0])
        .unwrap_or(field.len());
    field[..end]
        .split(|&c| c == 0)
        .filter(|a| !a.is_empty())
        .map(printable)
        .collect()
}

pub(super) fn le_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

pub(crate) fn le_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

pub(super) fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    printable(&b[..end])
}

/// A string from the trace as reports may print it, what the reader sees being what is there:
/// control characters other than NUL (an escape sequence in a host or range name would move the
/// reader's terminal) written as escapes (`\x1b`, `\u{9b}`), backslashes too (`\x5c`, so the
/// four characters `\x1b` never read as ESC), characters that change how text reads unseen
/// (a direction override, a zero-width space: [`crate::fixedfmt::hidden`]) as `\u{202e}`, and
/// bytes that are not UTF-8 as `\xff`. Every string of a trace passes here once, as it is
/// read, so every report and format shows it the same way.
pub fn printable(b: &[u8]) -> String {
    let plain =
        |c: char| !(c.is_control() && c != '\0') && c != '\\' && !crate::fixedfmt::hidden(c);
    if let Ok(s) = std::str::from_utf8(b)
        && s.chars().all(plain)
    {
        return s.to_owned();
    }
    let mut out = String::with_capacity(b.len() + 8);
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            if plain(c) {
                out.push(c);
            } else {
                escape_into(&mut out, c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

fn escape_into(out: &mut String, c: char) {
    if (c as u32) < 0x80 {
        out.push_str(&format!("\\x{:02x}", c as u32));
    } else {
        out.push_str(&format!("\\u{{{:x}}}", c as u32));
    }
}

/// Text already shown once ([`printable`], or made by the command) made safe to show again:
/// control and unseen characters escaped as there, backslashes left as they are (they are the
/// escapes `printable` wrote).
pub fn visible(s: &str) -> std::borrow::Cow<'_, str> {
    let odd = |c: char| (c.is_control() && c != '\0') || crate::fixedfmt::hidden(c);
    if !s.chars().any(odd) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if odd(c) {
            escape_into(&mut out, c);
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

pub(super) fn info_capacity(h: &[u8]) -> u64 {
    le_u64(h, header::CAPACITY).max(1)
}
