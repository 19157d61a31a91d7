//! The long connection's binary frame (`pbbp2.Frame`), protobuf by hand: SeqID (1, varint),
//! LogID (2, varint), service (3, varint), method (4, varint: 0 control, 1 data), headers (5,
//! repeated `{key = 1, value = 2}`), payload_encoding (6), payload_type (7), payload (8),
//! LogIDNew (9).

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frame {
    pub seq_id: u64,
    pub log_id: u64,
    pub service: i32,
    pub method: i32,
    pub headers: Vec<(String, String)>,
    pub payload_encoding: String,
    pub payload_type: String,
    pub payload: Vec<u8>,
    pub log_id_new: String,
}

pub const METHOD_CONTROL: i32 = 0;
pub const METHOD_DATA: i32 = 1;

impl Frame {
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.payload.len());
        put_varint_field(&mut out, 1, self.seq_id);
        put_varint_field(&mut out, 2, self.log_id);
        put_varint_field(&mut out, 3, self.service as i64 as u64);
        put_varint_field(&mut out, 4, self.method as i64 as u64);
        for (k, v) in &self.headers {
            let mut h = Vec::with_capacity(k.len() + v.len() + 4);
            put_bytes_field(&mut h, 1, k.as_bytes());
            put_bytes_field(&mut h, 2, v.as_bytes());
            put_bytes_field(&mut out, 5, &h);
        }
        if !self.payload_encoding.is_empty() {
            put_bytes_field(&mut out, 6, self.payload_encoding.as_bytes());
        }
        if !self.payload_type.is_empty() {
            put_bytes_field(&mut out, 7, self.payload_type.as_bytes());
        }
        if !self.payload.is_empty() {
            put_bytes_field(&mut out, 8, &self.payload);
        }
        if !self.log_id_new.is_empty() {
            put_bytes_field(&mut out, 9, self.log_id_new.as_bytes());
        }
        out
    }

    pub fn decode(mut buf: &[u8]) -> Result<Self, &'static str> {
        let mut f = Frame::default();
        while !buf.is_empty() {
            let key = get_varint(&mut buf)?;
            let (field, wire) = (key >> 3, key & 7);
            match wire {
                0 => {
                    let v = get_varint(&mut buf)?;
                    match field {
                        1 => f.seq_id = v,
                        2 => f.log_id = v,
                        3 => f.service = v as i32,
                        4 => f.method = v as i32,
                        _ => {}
                    }
                }
                2 => {
                    let b = get_bytes(&mut buf)?;
                    match field {
                        5 => f.headers.push(decode_header(b)?),
                        6 => f.payload_encoding = utf8(b)?,
                        7 => f.payload_type = utf8(b)?,
                        8 => f.payload = b.to_vec(),
                        9 => f.log_id_new = utf8(b)?,
                        _ => {}
                    }
                }
                1 => skip(&mut buf, 8)?,
                5 => skip(&mut buf, 4)?,
                _ => return Err("unsupported wire type"),
            }
        }
        Ok(f)
    }
}

fn utf8(b: &[u8]) -> Result<String, &'static str> {
    String::from_utf8(b.to_vec()).map_err(|_| "string field is not utf-8")
}

fn decode_header(mut buf: &[u8]) -> Result<(String, String), &'static str> {
    let (mut k, mut v) = (String::new(), String::new());
    while !buf.is_empty() {
        let key = get_varint(&mut buf)?;
        match (key >> 3, key & 7) {
            (1, 2) => k = utf8(get_bytes(&mut buf)?)?,
            (2, 2) => v = utf8(get_bytes(&mut buf)?)?,
            (_, 0) => {
                get_varint(&mut buf)?;
            }
            (_, 2) => {
                get_bytes(&mut buf)?;
            }
            _ => return Err("unsupported wire type in header"),
        }
    }
    Ok((k, v))
}

fn skip(buf: &mut &[u8], n: usize) -> Result<(), &'static str> {
    if buf.len() < n {
        return Err("truncated frame");
    }
    *buf = &buf[n..];
    Ok(())
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_varint_field(out: &mut Vec<u8>, field: u64, v: u64) {
    put_varint(out, field << 3);
    put_varint(out, v);
}

fn put_bytes_field(out: &mut Vec<u8>, field: u64, b: &[u8]) {
    put_varint(out, (field << 3) | 2);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn get_varint(buf: &mut &[u8]) -> Result<u64, &'static str> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let Some((&b, rest)) = buf.split_first() else {
            return Err("truncated varint");
        };
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint too long")
}

fn get_bytes<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], &'static str> {
    let n = get_varint(buf)? as usize;
    if buf.len() < n {
        return Err("truncated length-delimited field");
    }
    let (b, rest) = buf.split_at(n);
    *buf = rest;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_known_bytes() {
        let f = Frame {
            seq_id: 300,
            log_id: 1,
            service: 7,
            method: METHOD_DATA,
            headers: vec![("type".into(), "event".into())],
            payload: b"{}".to_vec(),
            ..Frame::default()
        };
        let b = f.encode();
        // 300 = 0xac 0x02 as a varint.
        assert_eq!(&b[..3], &[0x08, 0xac, 0x02]);
        assert_eq!(Frame::decode(&b).unwrap(), f);
        assert!(Frame::decode(&[0x08]).is_err());
        assert!(Frame::decode(&[0x42, 0x05, 0x01]).is_err());
    }
}
