//! Image decoding on the decode threads: JPEG, PNG and WebP bytes in a binary column
//! become `(H, W, C)` uint8 tensors. Resized to `[H, W]` or center-cropped, they have
//! one shape (Arrow's fixed-shape tensor type, so a batch reaches numpy as one
//! `(batch, H, W, C)` array without copying), as torchvision's `Resize` / `CenterCrop`
//! make them; otherwise each keeps its own size (Arrow's variable-shape tensor type: a
//! batch is a list of arrays, each a view of the decoded bytes).
//!
//! Options (`format_options`), taken out before the format reads its own:
//! - `decode`: WebDataset and raw files, `{"jpg": "rgb8", "png": "rgb8"}` (fields by
//!   extension; raw files by their content's type) or `"rgb8"` for every image type;
//! - `decode_images`: Parquet and Arrow, `{"column": "rgb8"}`;
//! - `resize`: `[H, W]`, or `N` to scale the shorter side to N (bilinear, antialiased);
//! - `center_crop`: `[H, W]` or `N` (padding with zeros where the image is smaller).
//!
//! Channels: `"rgb8"` (3), `"l8"` (grey, 1), `"rgba8"` (4). No decoded image may take
//! more than 512 MiB: the image crate's limits for PNG and WebP, and for JPEG (decoded by
//! zune-jpeg directly, into a buffer each decode thread reuses) a check of its header.

use std::sync::Arc;

use arrow_array::types::UInt8Type;
use arrow_array::{Array, ArrayRef, FixedSizeListArray, UInt8Array};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use fast_image_resize::images::Image as FirImage;
use fast_image_resize::{FilterType as FirFilter, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::{DynamicImage, ImageFormat};

use super::cells::{
    CellDecoder, Outcomes, cell_bytes, guarded, map_on_pool, media_bytes_type, nulls_of,
};
use super::image_spec::{Channels, ImageSpec, Resize, bad};
use super::{OnError, tensor_field, variable_tensor_field};
use crate::buffers::BufferPool;
use crate::error::{Error, Result};

impl ImageSpec {
    /// Resolves the spec against the decoded schema: which columns hold images.
    pub fn bind(
        &self,
        format: &'static str,
        schema: &SchemaRef,
        on_error: OnError,
    ) -> Result<ImageDecode> {
        let mut columns = Vec::new();
        for (i, field) in schema.fields().iter().enumerate() {
            let binary = media_bytes_type(field.data_type());
            let wanted = if !self.by_column.is_empty() {
                self.by_column.get(field.name()).map(|ch| (*ch, None))
            } else if format == "raw" {
                // A raw file's type is its content's; the keys say which are allowed,
                // and one column has one shape, so one channel layout.
                let mut layouts = self.by_extension.values();
                let channels = *layouts.next().unwrap_or(&Channels::Rgb);
                if layouts.any(|c| *c != channels) {
                    return Err(bad(
                        "decode",
                        "raw files share one column: give every image type the same channels",
                    ));
                }
                (field.name() == "bytes").then(|| {
                    (
                        channels,
                        Some(self.by_extension.keys().cloned().collect::<Vec<_>>()),
                    )
                })
            } else {
                let ext = field.name().rsplit('.').next().unwrap_or(field.name());
                self.by_extension.get(ext).map(|ch| (*ch, None))
            };
            let Some((channels, allowed)) = wanted else {
                continue;
            };
            if !binary {
                return Err(Error::invalid_argument(format!(
                    "column {:?} ({}) holds no image bytes",
                    field.name(),
                    field.data_type()
                )));
            }
            columns.push(ImageColumn {
                index: i,
                channels,
                allowed,
            });
        }
        for name in self.by_column.keys() {
            if schema.index_of(name).is_err() {
                return Err(Error::invalid_argument(format!(
                    "decode_images names {name:?}, which is not a column (columns: {:?})",
                    schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
                )));
            }
        }
        let fixed = self.shape();
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        for column in &columns {
            let name = fields[column.index].name().clone();
            let channels = column.channels.count();
            fields[column.index] = match fixed {
                Some((height, width)) => tensor_field(
                    &name,
                    DataType::UInt8,
                    &[height as usize, width as usize, channels],
                    true,
                ),
                None => {
                    variable_tensor_field(&name, DataType::UInt8, &[None, None, Some(channels)])
                }
            };
        }
        Ok(ImageDecode {
            columns,
            resize: self.resize,
            fixed,
            on_error,
            schema: Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
            pixels: BufferPool::keeping(POOLED_PIXEL_BUFFERS),
        })
    }
}

#[derive(Debug, Clone)]
struct ImageColumn {
    index: usize,
    channels: Channels,
    /// For raw files: the image types allowed (by extension name).
    allowed: Option<Vec<String>>,
}

impl CellDecoder for ImageDecode {
    fn media(&self) -> &'static str {
        "image"
    }

    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn on_error(&self) -> OnError {
        self.on_error
    }

    fn columns(&self) -> Vec<usize> {
        self.columns.iter().map(|c| c.index).collect()
    }

    fn decode_column(
        &self,
        index: usize,
        column: &ArrayRef,
    ) -> std::result::Result<(ArrayRef, Outcomes), String> {
        let image_column = self
            .columns
            .iter()
            .find(|c| c.index == index)
            .ok_or("not an image column")?;
        let input = cell_bytes(column, "image")?;
        match self.fixed {
            Some(shape) => self.decode_fixed(image_column, &input, shape),
            None => self.decode_own_sizes(image_column, &input),
        }
        .map_err(|e| e.to_string())
    }
}

/// Decodes a prepared dataset's image columns; see the module docs.
#[derive(Debug)]
pub struct ImageDecode {
    columns: Vec<ImageColumn>,
    resize: Option<Resize>,
    /// `(height, width)` of every output image; `None`: each its own.
    fixed: Option<(u32, u32)>,
    on_error: OnError,
    /// The schema with image columns as tensors.
    pub schema: SchemaRef,
    /// The fixed-shape tensors' buffers, used again once their batches are released
    /// (joined into re-batched output, or let go by the consumer).
    pixels: Arc<BufferPool>,
}

/// Free pixel buffers kept for the next decodes: a unit's images (4 MB of files) decode
/// into a buffer of 16 MB at 224x224, and with two decode threads about four are out at
/// once. Fresh ones cost a decode thread 6% of its time in page faults and zeroing.
const POOLED_PIXEL_BUFFERS: usize = 4;

fn extension_of(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Jpeg => "jpg",
        ImageFormat::Png => "png",
        ImageFormat::WebP => "webp",
        ImageFormat::Gif => "gif",
        ImageFormat::Tiff => "tiff",
        ImageFormat::Bmp => "bmp",
        _ => "other",
    }
}

/// A decode thread keeps its pixel buffer between images up to this size; a larger
/// one (a rare huge image) is given back after use.
const KEEP_SCRATCH_BYTES: usize = 64 << 20;

/// What each decode thread reuses from one image to the next, so that decoding a
/// stream of images allocates (and the kernel zeroes) no fresh pages per image.
struct Scratch {
    /// The decoded image at its own size, before resizing.
    pixels: Vec<u8>,
    resizer: Resizer,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch {
        pixels: Vec::new(),
        resizer: Resizer::new(),
    });
}

/// Decodes a JPEG into `buf` (grown as needed, never shrunk) as RGB, or as grey when
/// `channels` asks for it and the file is grey; returns `(width, height, layout)`.
fn decode_jpeg(
    bytes: &[u8],
    channels: Channels,
    buf: &mut Vec<u8>,
) -> std::result::Result<(u32, u32, PixelType), String> {
    use zune_core::colorspace::ColorSpace;
    let options = zune_core::options::DecoderOptions::default()
        .set_strict_mode(false)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX));
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(
        zune_core::bytestream::ZCursor::new(bytes),
        options,
    );
    decoder.decode_headers().map_err(|e| e.to_string())?;
    let grey_file = decoder.input_colorspace() == Some(ColorSpace::Luma);
    let (space, pixel_type) = if channels == Channels::Grey && grey_file {
        (ColorSpace::Luma, PixelType::U8)
    } else {
        (ColorSpace::RGB, PixelType::U8x3)
    };
    decoder.set_options(decoder.options().jpeg_set_out_colorspace(space));
    let (Some((w, h)), Some(size)) = (decoder.dimensions(), decoder.output_buffer_size()) else {
        return Err("the JPEG's dimensions could not be read".into());
    };
    // The same bound as PNG and WebP get: the image crate's default limits.
    image::Limits::default()
        .reserve_usize(size)
        .map_err(|e| format!("a {w}x{h} image, {size} bytes decoded: {e}"))?;
    if buf.len() < size {
        buf.resize(size, 0);
    }
    decoder
        .decode_into(&mut buf[..size])
        .map_err(|e| e.to_string())?;
    let orientation = decoder
        .exif()
        .and_then(|exif| image::metadata::Orientation::from_exif_chunk(exif))
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let (w, h) = if orientation == image::metadata::Orientation::NoTransforms {
        (w, h)
    } else {
        oriented(buf, size, (w as u32, h as u32), pixel_type, orientation)?
    };
    if channels == Channels::Grey && pixel_type == PixelType::U8x3 {
        // In place: pixel i's grey level goes to byte i, which its RGB bytes start at or past.
        for i in 0..w * h {
            buf[i] = pillow_luma([buf[3 * i], buf[3 * i + 1], buf[3 * i + 2]]);
        }
        return Ok((w as u32, h as u32, PixelType::U8));
    }
    Ok((w as u32, h as u32, pixel_type))
}

/// The first `size` bytes of `buf` (a `w x h` image of `pixel_type`) turned as the
/// EXIF `orientation` says, in place; the new `(width, height)` as `usize`s.
fn oriented(
    buf: &mut [u8],
    size: usize,
    (w, h): (u32, u32),
    pixel_type: PixelType,
    orientation: image::metadata::Orientation,
) -> std::result::Result<(usize, usize), String> {
    let pixels = buf[..size].to_vec();
    let mut img = match pixel_type {
        PixelType::U8 => image::GrayImage::from_raw(w, h, pixels).map(DynamicImage::ImageLuma8),
        _ => image::RgbImage::from_raw(w, h, pixels).map(DynamicImage::ImageRgb8),
    }
    .ok_or("decoded pixels of the wrong size")?;
    img.apply_orientation(orientation);
    buf[..size].copy_from_slice(img.as_bytes());
    Ok((img.width() as usize, img.height() as usize))
}

impl ImageDecode {
    /// Decodes one image into `out` (`height * width * channels` bytes of the fixed shape).
    fn decode_one(
        &self,
        column: &ImageColumn,
        bytes: &[u8],
        out: &mut [u8],
    ) -> std::result::Result<(), String> {
        let format = image_format(column, bytes)?;
        SCRATCH.with_borrow_mut(|scratch| {
            let outcome = self.decode_with(scratch, column, format, bytes, out);
            if scratch.pixels.capacity() > KEEP_SCRATCH_BYTES {
                scratch.pixels = Vec::new();
            }
            outcome
        })
    }

    /// Decodes one image at its own size (or resized by its shorter side): its pixels,
    /// height and width.
    fn decode_own_size(
        &self,
        column: &ImageColumn,
        bytes: &[u8],
    ) -> std::result::Result<(Vec<u8>, u32, u32), String> {
        let format = image_format(column, bytes)?;
        SCRATCH.with_borrow_mut(|scratch| {
            let (w, h, pixel_type) = decode_pixels(&mut scratch.pixels, column, format, bytes)?;
            let len = w as usize * h as usize * column.channels.count();
            let outcome = match self.resize {
                Some(Resize::Shorter(n)) => {
                    let (nw, nh) = shorter_side(w, h, n);
                    let decoded = scratch.pixels.get_mut(..len).ok_or("short decode")?;
                    let source = FirImage::from_slice_u8(w, h, decoded, pixel_type)
                        .map_err(|e| e.to_string())?;
                    let mut resized = FirImage::new(nw, nh, pixel_type);
                    let options = ResizeOptions::new()
                        .resize_alg(ResizeAlg::Convolution(FirFilter::Bilinear));
                    scratch
                        .resizer
                        .resize(&source, &mut resized, &options)
                        .map_err(|e| e.to_string())?;
                    Ok((resized.into_vec(), nh, nw))
                }
                _ => scratch
                    .pixels
                    .get(..len)
                    .map(|pixels| (pixels.to_vec(), h, w))
                    .ok_or_else(|| format!("{w}x{h} pixels decoded into fewer bytes")),
            };
            if scratch.pixels.capacity() > KEEP_SCRATCH_BYTES {
                scratch.pixels = Vec::new();
            }
            outcome
        })
    }
}

/// The image type of `bytes`, checked against what `column` may hold.
fn image_format(column: &ImageColumn, bytes: &[u8]) -> std::result::Result<ImageFormat, String> {
    let format = image::guess_format(bytes)
        .map_err(|_| "not a JPEG, PNG, WebP, GIF, TIFF or BMP image".to_string())?;
    if !matches!(
        format,
        ImageFormat::Jpeg
            | ImageFormat::Png
            | ImageFormat::WebP
            | ImageFormat::Gif
            | ImageFormat::Tiff
            | ImageFormat::Bmp
    ) {
        return Err(format!(
            "a {format:?} image; shardflow decodes JPEG, PNG, WebP, GIF, TIFF and BMP"
        ));
    }
    if let Some(allowed) = &column.allowed {
        let ext = extension_of(format);
        let ok = allowed
            .iter()
            .any(|a| a == ext || (ext == "jpg" && a == "jpeg") || (ext == "tiff" && a == "tif"));
        if !ok {
            return Err(format!("a {ext} image, and decode= names only {allowed:?}"));
        }
    }
    Ok(format)
}

/// torchvision's `Resize(n)`: the shorter side to `n`, the longer `int(n * long / short)`;
/// `(width, height)`.
fn shorter_side(w: u32, h: u32, n: u32) -> (u32, u32) {
    if w <= h {
        (n, (n as u64 * h as u64 / w.max(1) as u64).max(1) as u32)
    } else {
        ((n as u64 * w as u64 / h.max(1) as u64).max(1) as u32, n)
    }
}

/// Decodes `bytes` (of type `format`) into `pixels` in `column`'s channels; returns
/// `(width, height, layout)`.
fn decode_pixels(
    pixels: &mut Vec<u8>,
    column: &ImageColumn,
    format: ImageFormat,
    bytes: &[u8],
) -> std::result::Result<(u32, u32, PixelType), String> {
    if format == ImageFormat::Jpeg && column.channels != Channels::Rgba {
        return decode_jpeg(bytes, column.channels, pixels);
    }
    use image::ImageDecoder;
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), format);
    let mut limits = image::Limits::default();
    reader.limits(limits.clone());
    let mut decoder = reader.into_decoder().map_err(|e| e.to_string())?;
    limits
        .reserve(decoder.total_bytes())
        .map_err(|e| e.to_string())?;
    // As `datasets` decodes: the EXIF orientation applied (PIL's `exif_transpose`).
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut img = DynamicImage::from_decoder(decoder).map_err(|e| e.to_string())?;
    img.apply_orientation(orientation);
    let (w, h) = (img.width(), img.height());
    let (decoded, pixel_type) = match column.channels {
        // No copy when the decoder made RGB8 already (most PNGs).
        Channels::Rgb => (img.into_rgb8().into_raw(), PixelType::U8x3),
        Channels::Grey => (grey(img), PixelType::U8),
        Channels::Rgba => (img.into_rgba8().into_raw(), PixelType::U8x4),
    };
    *pixels = decoded;
    Ok((w, h, pixel_type))
}

impl ImageDecode {
    /// `decode_one` with this thread's scratch: decodes `bytes` (of type `format`) into
    /// `scratch.pixels`, then resizes and crops them into `out`.
    fn decode_with(
        &self,
        scratch: &mut Scratch,
        column: &ImageColumn,
        format: ImageFormat,
        bytes: &[u8],
        out: &mut [u8],
    ) -> std::result::Result<(), String> {
        let Scratch { pixels, resizer } = scratch;
        let (w, h, pixel_type) = decode_pixels(pixels, column, format, bytes)?;
        let channels = column.channels.count();
        let len = w as usize * h as usize * channels;
        let have = pixels.len();
        let decoded = pixels
            .get_mut(..len)
            .ok_or_else(|| format!("{w}x{h} pixels decoded into {have} bytes"))?;
        let source =
            FirImage::from_slice_u8(w, h, decoded, pixel_type).map_err(|e| e.to_string())?;
        let (nw, nh) = match self.resize {
            None => (w, h),
            Some(Resize::Exact(rh, rw)) => (rw, rh),
            Some(Resize::Shorter(n)) => shorter_side(w, h, n),
        };
        let (oh, ow) = self.fixed.ok_or("no fixed shape to decode into")?;
        let (left, top) = (crop_start(nw, ow), crop_start(nh, oh));
        if (nw, nh) == (w, h) {
            place(&source, left, top, (ow, oh), channels, out);
            return Ok(());
        }
        let mut options =
            ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FirFilter::Bilinear));
        if left >= 0 && top >= 0 {
            // Resize only the window the crop keeps, straight into the output: the same
            // sample positions and filter width as resizing the whole image first.
            let (sx, sy) = (w as f64 / nw as f64, h as f64 / nh as f64);
            options = options.crop(
                left as f64 * sx,
                top as f64 * sy,
                ow as f64 * sx,
                oh as f64 * sy,
            );
            let mut target =
                FirImage::from_slice_u8(ow, oh, out, pixel_type).map_err(|e| e.to_string())?;
            return resizer
                .resize(&source, &mut target, &options)
                .map_err(|e| e.to_string());
        }
        let mut resized = FirImage::new(nw, nh, pixel_type);
        resizer
            .resize(&source, &mut resized, &options)
            .map_err(|e| e.to_string())?;
        place(&resized, left, top, (ow, oh), channels, out);
        Ok(())
    }

    /// A column's images decoded into the fixed shape (one tensor per row, zeros for a
    /// null or undecodable one), and each row's outcome.
    fn decode_fixed(
        &self,
        column: &ImageColumn,
        input: &arrow_array::LargeBinaryArray,
        (height, width): (u32, u32),
    ) -> Result<(ArrayRef, Outcomes)> {
        let size = height as usize * width as usize * column.channels.count();
        // Zeroed: a null or undecodable row is all zeros.
        let mut pixels = self.pixels.take(input.len() * size);
        pixels.resize(input.len() * size, 0);
        // Each row's tensor, locked once by the thread that decodes it.
        let outs: Vec<std::sync::Mutex<&mut [u8]>> = pixels
            .chunks_mut(size.max(1))
            .map(std::sync::Mutex::new)
            .collect();
        let outcomes = map_on_pool(outs.len(), |row| match input.is_null(row) {
            true => Ok(()),
            false => {
                let mut out = outs[row].lock().unwrap_or_else(|p| p.into_inner());
                guarded(|| self.decode_one(column, input.value(row), &mut out))
            }
        });
        drop(outs);
        let field = Arc::new(Field::new_list_field(DataType::UInt8, false));
        let len = pixels.len();
        let values = Arc::new(UInt8Array::new(
            ScalarBuffer::new(self.pixels.buffer(pixels), 0, len),
            None,
        ));
        let array = FixedSizeListArray::try_new(field, size as i32, values, nulls_of(input))
            .map_err(|e| Error::Internal(format!("image column: {e}")))?;
        Ok((Arc::new(array), outcomes))
    }

    /// A column's images each at its own size: a variable-shape tensor column (a null
    /// or undecodable row holds no pixels and shape `[0, 0, C]`), and each row's outcome.
    fn decode_own_sizes(
        &self,
        column: &ImageColumn,
        input: &arrow_array::LargeBinaryArray,
    ) -> Result<(ArrayRef, Outcomes)> {
        let channels = column.channels.count();
        let images: Vec<std::result::Result<Option<(Vec<u8>, u32, u32)>, String>> =
            map_on_pool(input.len(), |row| match input.is_null(row) {
                true => Ok(None),
                false => guarded(|| self.decode_own_size(column, input.value(row))).map(Some),
            });
        let rows = images
            .into_iter()
            .map(|image| {
                image.map(|i| {
                    i.map(|(pixels, h, w)| (pixels, vec![h as i32, w as i32, channels as i32]))
                })
            })
            .collect();
        let (array, outcomes) = super::variable_tensor_column::<UInt8Type>(
            rows,
            &[0, 0, channels as i32],
            nulls_of(input),
        )
        .map_err(Error::Internal)?;
        Ok((Arc::new(array), outcomes))
    }
}

/// Copies the `(width, height)` window at `(left, top)` of `image` into `out`, with
/// zeros where the window reaches past the image.
fn place(
    image: &FirImage,
    left: i64,
    top: i64,
    (ow, oh): (u32, u32),
    channels: usize,
    out: &mut [u8],
) {
    let (w, h, pixels) = (image.width() as i64, image.height() as i64, image.buffer());
    out.fill(0);
    let x0 = left.max(0);
    let x1 = (left + ow as i64).min(w);
    if x1 <= x0 {
        return;
    }
    let len = (x1 - x0) as usize * channels;
    for y in 0..oh as i64 {
        let sy = y + top;
        if sy < 0 || sy >= h {
            continue;
        }
        let src = (sy * w + x0) as usize * channels;
        let dst = (y as usize * ow as usize + (x0 - left) as usize) * channels;
        out[dst..dst + len].copy_from_slice(&pixels[src..src + len]);
    }
}

/// One grey level per pixel. Colour becomes grey by ITU-R 601-2 luma, in Pillow's
/// fixed-point arithmetic, so that `"l8"` equals `Image.convert("L")`.
fn grey(img: DynamicImage) -> Vec<u8> {
    match img {
        DynamicImage::ImageLuma8(i) => i.into_raw(),
        i @ (DynamicImage::ImageLumaA8(_)
        | DynamicImage::ImageLuma16(_)
        | DynamicImage::ImageLumaA16(_)) => i.into_luma8().into_raw(),
        other => other
            .into_rgb8()
            .pixels()
            .map(|p| pillow_luma(p.0))
            .collect(),
    }
}

/// ITU-R 601-2 luma in Pillow's fixed-point arithmetic.
fn pillow_luma(rgb: [u8; 3]) -> u8 {
    let [r, g, b] = rgb.map(u32::from);
    ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16) as u8
}

/// Where a center crop of `crop` pixels starts along an axis of `size` pixels, as
/// torchvision's `center_crop` places it: `round((size - crop) / 2)` (halves to even)
/// where the image is large enough; where it is smaller, torchvision first pads it with
/// `(crop - size) // 2` zeros before (the odd one after), so the image starts that far
/// inside the crop (a negative start: zero padding).
fn crop_start(size: u32, crop: u32) -> i64 {
    if size >= crop {
        ((size as f64 - crop as f64) / 2.0).round_ties_even() as i64
    } else {
        -(((crop - size) / 2) as i64)
    }
}
