//! The NULL procedure of the NFS program over ONC RPC on TCP (pure): the call's bytes and what a
//! reply to it says (RFC 5531; record marking, section 11). A server that answers it with
//! SUCCESS has its RPC layer up and serves the NFS version asked for.

/// ONC RPC program number of NFS.
pub const NFS_PROGRAM: u32 = 100_003;
/// The version the clients mount (`nfsvers=4.x`); a server without it serves them nothing.
pub const NFS_VERSION: u32 = 4;
/// The reply's record is read up to this many bytes: a NULL reply is 24.
pub const MAX_REPLY: usize = 400;

const CALL: u32 = 0;
const REPLY: u32 = 1;
const RPC_VERSION: u32 = 2;
const NULL_PROCEDURE: u32 = 0;
const AUTH_NONE: u32 = 0;
const MSG_ACCEPTED: u32 = 0;
const SUCCESS: u32 = 0;
/// The record mark's bit for the last fragment of a record.
const LAST_FRAGMENT: u32 = 0x8000_0000;

/// The call with transaction id `xid`, as one record: the record mark, then the call header
/// (no credential, no verifier) and no arguments.
pub fn null_call(xid: u32) -> Vec<u8> {
    let words = [
        xid,
        CALL,
        RPC_VERSION,
        NFS_PROGRAM,
        NFS_VERSION,
        NULL_PROCEDURE,
        AUTH_NONE,
        0,
        AUTH_NONE,
        0,
    ];
    let body_len = u32::try_from(words.len() * 4).expect("a short call");
    let mut bytes = (LAST_FRAGMENT | body_len).to_be_bytes().to_vec();
    bytes.extend(words.iter().flat_map(|word| word.to_be_bytes()));
    bytes
}

/// The length of the record a record mark announces.
pub fn record_length(mark: [u8; 4]) -> usize {
    (u32::from_be_bytes(mark) & !LAST_FRAGMENT) as usize
}

/// Whether `record` (without its mark) is a successful reply to the call `xid`; `Err` says
/// what it is instead.
pub fn answers(xid: u32, record: &[u8]) -> Result<(), String> {
    let word = |i: usize| -> Result<u32, String> {
        let bytes = record
            .get(i * 4..i * 4 + 4)
            .ok_or_else(|| format!("a reply of {} bytes is cut short", record.len()))?;
        Ok(u32::from_be_bytes(bytes.try_into().expect("four bytes")))
    };
    if word(0)? != xid || word(1)? != REPLY {
        return Err("the answer is not a reply to the call".to_owned());
    }
    if word(2)? != MSG_ACCEPTED {
        return Err("the server denied the call (RPC version or authentication)".to_owned());
    }
    // The verifier: a flavor and opaque bytes padded to four.
    let verifier_len = word(4)? as usize;
    let status_at = 5 + verifier_len.div_ceil(4);
    match word(status_at)? {
        SUCCESS => Ok(()),
        1 => Err(format!("program {NFS_PROGRAM} is not served there")),
        2 => Err(format!("NFS version {NFS_VERSION} is not served there")),
        status => Err(format!("the call was not carried out (accept status {status})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(xid: u32, words: &[u32]) -> Vec<u8> {
        [xid, REPLY]
            .iter()
            .chain(words)
            .flat_map(|word| word.to_be_bytes())
            .collect()
    }

    #[test]
    fn the_call_is_one_record_of_the_nfs_null_procedure() {
        let call = null_call(0x0102_0304);
        assert_eq!(call.len(), 44);
        assert_eq!(call[..4], [0x80, 0, 0, 40], "last fragment, 40 bytes");
        assert_eq!(record_length(call[..4].try_into().unwrap()), 40);
        assert_eq!(call[4..8], [1, 2, 3, 4], "the xid");
        assert_eq!(call[16..20], 100_003u32.to_be_bytes(), "the NFS program");
        assert_eq!(call[20..24], 4u32.to_be_bytes(), "version 4");
        assert_eq!(call[24..28], [0, 0, 0, 0], "procedure 0, NULL");
    }

    #[test]
    fn only_an_accepted_successful_reply_to_this_call_answers() {
        assert_eq!(answers(7, &reply(7, &[MSG_ACCEPTED, AUTH_NONE, 0, SUCCESS])), Ok(()));
        let with_verifier = reply(7, &[MSG_ACCEPTED, 1, 5, 0, 0, SUCCESS]);
        assert_eq!(answers(7, &with_verifier), Ok(()), "a 5-byte verifier takes two words");
        assert!(answers(8, &reply(7, &[MSG_ACCEPTED, AUTH_NONE, 0, SUCCESS])).is_err());
        let mismatch = answers(7, &reply(7, &[MSG_ACCEPTED, AUTH_NONE, 0, 2, 3, 3]));
        assert!(mismatch.unwrap_err().contains("version 4"));
        assert!(answers(7, &reply(7, &[1, 0, 2, 2])).unwrap_err().contains("denied"));
        assert!(
            answers(7, &reply(7, &[MSG_ACCEPTED]))
                .unwrap_err()
                .contains("cut short")
        );
    }
}
