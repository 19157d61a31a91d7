//! A QR code as a `data:image/png;base64,...` URL, for the `qr_code_image` of a QR login
//! flow. The PNG is written by hand (8-bit grayscale, stored zlib blocks): a QR image is a
//! few kilobytes, and no image crate is needed for it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + x as u32) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let mut c = kind.to_vec();
    c.extend_from_slice(data);
    out.extend_from_slice(&c);
    out.extend_from_slice(&crc32(&c).to_be_bytes());
}

/// An 8-bit grayscale PNG; the zlib stream uses stored blocks (a QR image is small).
fn png_gray(width: u32, rows: &[Vec<u8>]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(rows.len() * (width as usize + 1));
    for r in rows {
        raw.push(0);
        raw.extend_from_slice(r);
    }
    let mut z = vec![0x78, 0x01];
    let mut blocks = raw.chunks(65_535).peekable();
    while let Some(b) = blocks.next() {
        z.push(u8::from(blocks.peek().is_none()));
        z.extend_from_slice(&(b.len() as u16).to_le_bytes());
        z.extend_from_slice(&(!(b.len() as u16)).to_le_bytes());
        z.extend_from_slice(b);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&(rows.len() as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 0, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &z);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// `data:image/png;base64,...` of a QR code of `text` (4 px per module, 4-module margin).
pub fn qr_data_url(text: &str) -> Option<String> {
    let code =
        qrcode::QrCode::with_error_correction_level(text.as_bytes(), qrcode::EcLevel::M).ok()?;
    let n = code.width();
    let colors = code.to_colors();
    const SCALE: usize = 4;
    const MARGIN: usize = 4;
    let side = (n + 2 * MARGIN) * SCALE;
    let mut rows = Vec::with_capacity(side);
    for y in 0..side {
        let my = (y / SCALE).checked_sub(MARGIN).filter(|v| *v < n);
        let row: Vec<u8> = (0..side)
            .map(|x| {
                let mx = (x / SCALE).checked_sub(MARGIN).filter(|v| *v < n);
                match (mx, my) {
                    (Some(mx), Some(my)) if colors[my * n + mx] == qrcode::Color::Dark => 0,
                    _ => 255,
                }
            })
            .collect();
        rows.push(row);
    }
    Some(format!(
        "data:image/png;base64,{}",
        STANDARD.encode(png_gray(side as u32, &rows))
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qr_png_is_a_png() {
        let url =
            qr_data_url("https://liteapp.weixin.qq.com/q/7GiQu1?qrcode=abc&bot_type=3").unwrap();
        let b64 = url.strip_prefix("data:image/png;base64,").unwrap();
        let png = STANDARD.decode(b64).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }
}
